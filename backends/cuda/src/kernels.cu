// kernels.cu - the CUDA backend's kernels. All per-element / per-block maths
// is in touchstone/cuda/kernel_math.h (host-tested); this file only maps it
// onto threads, warps and blocks. No atomics: for a given grid every result is
// computed in one fixed order (run-to-run deterministic on a given device).
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels.h"

namespace touchstone::cuda {
namespace {

namespace cm = touchstone::cuda_math;
constexpr unsigned kFull = 0xffffffffu;

template <typename F>
cudaError_t dispatch(WType t, F&& f) {
  switch (t) {
    case WType::F32:
      f(std::integral_constant<WType, WType::F32>{});
      break;
    case WType::F16:
      f(std::integral_constant<WType, WType::F16>{});
      break;
    case WType::Q4_0:
      f(std::integral_constant<WType, WType::Q4_0>{});
      break;
    case WType::Q4_1:
      f(std::integral_constant<WType, WType::Q4_1>{});
      break;
    case WType::Q5_0:
      f(std::integral_constant<WType, WType::Q5_0>{});
      break;
    case WType::Q8_0:
      f(std::integral_constant<WType, WType::Q8_0>{});
      break;
    case WType::Q4_K:
      f(std::integral_constant<WType, WType::Q4_K>{});
      break;
    case WType::Q6_K:
      f(std::integral_constant<WType, WType::Q6_K>{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// The xor butterfly of cm::warp_sum_emulated.
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

unsigned blocks_for(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// ---- embedding rows ------------------------------------------------------------
template <WType T>
__global__ void get_rows_k(const uint8_t* table, const int32_t* tokens, int n_embd, double scale,
                           float* x) {
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_embd) return;
  const uint8_t* row = table + int64_t{tokens[t]} * cm::row_bytes(T, n_embd);
  x[int64_t{t} * n_embd + i] = cm::embd_scaled(cm::deq_elem(T, row, i), scale);
}

// ---- residual add + RMSNorm (fp64 accumulation) ----------------------------------
constexpr int kNormThreads = 256;
__global__ void add_rmsnorm_k(float* x, const float* delta, const float* w, float* out, int n,
                              double eps) {
  __shared__ double red[kNormThreads];
  const int64_t r = blockIdx.x;
  float* xr = x + r * n;
  double ss = 0.0;
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    float v = xr[i];
    if (delta) {
      v = cm::residual_add(v, delta[r * n + i]);
      xr[i] = v;
    }
    ss = __dadd_rn(ss, __dmul_rn(double{v}, double{v}));
  }
  red[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kNormThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] = __dadd_rn(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  const double inv = cm::rms_inv(red[0], n, eps);
  for (int i = threadIdx.x; i < n; i += kNormThreads)
    out[r * n + i] = cm::rms_scale(xr[i], inv, w[i]);
}

// ---- matrix-vector: one warp per row, weights dequantized in registers -------------
constexpr int kMatvecWarps = 4;
template <WType T>
__global__ void matvec_k(const uint8_t* W, const float* __restrict__ x, float* y, int n_out,
                         int n_in) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kMatvecWarps + warp;
  if (row >= n_out) return;  // whole warp leaves together
  const uint8_t* w = W + int64_t{row} * cm::row_bytes(T, n_in);
  const int64_t n_chunks = n_in / cm::kQK;
  float acc = 0.0f;
  for (int64_t c = lane; c < n_chunks; c += 32) acc = cm::chunk_dot(T, w, c, x, acc);
  acc = warp_sum(acc);
  if (lane == 0) y[row] = acc;
}

template <WType T>
__global__ void dequantize_k(const uint8_t* W, float* out, int64_t total, int n_in) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t r = idx / n_in, c = idx % n_in;
  out[idx] = cm::deq_elem(T, W + r * cm::row_bytes(T, n_in), c);
}

// ---- RoPE + KV store ---------------------------------------------------------------
// One block per token: q's heads rotated in place, k's rotated into the cache.
__global__ void rope_store_k(float* q, const float* k, const float* v, float* k_cache,
                             float* v_cache, const double* cs, const int32_t* d_params,
                             RopeParams p) {
  const int t = blockIdx.x;
  const int pos = d_params[0] + t;
  const int hd = p.head_dim, half = p.n_rot / 2, q_dim = p.n_head * hd, kv_dim = p.n_head_kv * hd;
  const double* cs_pos = cs + int64_t{pos - p.rope_origin} * half * 2;
  float* qt = q + int64_t{t} * q_dim;
  for (int idx = threadIdx.x; idx < p.n_head * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    int a = 0, b = 0;
    cm::rope_pair(i, p.n_rot, p.neox, &a, &b);
    cm::rope_rotate(qt + h * hd + a, qt + h * hd + b, cs_pos[2 * i], cs_pos[2 * i + 1]);
  }
  const int row = pos + p.write_offset;
  if (row >= p.max_ctx) return;  // kv_write_next at the cache's end: dropped
  const float* kt = k + int64_t{t} * kv_dim;
  float* kc = k_cache + int64_t{row} * kv_dim;
  for (int idx = threadIdx.x; idx < kv_dim; idx += blockDim.x) kc[idx] = kt[idx];
  __syncthreads();  // the block's plain copy before the rotated pairs overwrite it
  for (int idx = threadIdx.x; idx < p.n_head_kv * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    int a = 0, b = 0;
    cm::rope_pair(i, p.n_rot, p.neox, &a, &b);
    float x0 = kt[h * hd + a], x1 = kt[h * hd + b];
    cm::rope_rotate(&x0, &x1, cs_pos[2 * i], cs_pos[2 * i + 1]);
    kc[h * hd + a] = x0;
    kc[h * hd + b] = x1;
  }
  const float* vt = v + int64_t{t} * kv_dim;
  float* vc = v_cache + int64_t{row} * kv_dim;
  for (int idx = threadIdx.x; idx < kv_dim; idx += blockDim.x) vc[idx] = vt[idx];
}

// ---- attention (split-K, online softmax; order documented in kernel_math.h) ------------
constexpr int kAttnWarps = 4;
template <int HD>
__device__ __forceinline__ bool lane_has(int lane, int e) {
  return HD % 32 == 0 || lane + 32 * e < HD;
}
template <int HD>
__global__ void attention_k(const float* q, const float* k_cache, const float* v_cache,
                            float* partial, const int32_t* d_params, AttnParams prm) {
  // Elements per lane: lane L holds L, L+32, ... (head_dim 16 / 32: lanes >= HD
  // hold zeros and write nothing).
  constexpr int EPL = (HD + 31) / 32;
  const int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z, n_split = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_head = prm.n_head, n_head_kv = prm.n_head_kv;
  const int kv_dim = n_head_kv * HD;
  const int kvh = prm.gqa_modulo ? h % n_head_kv : h / (n_head / n_head_kv);
  const int pos = d_params[0] + t;
  const cm::KvRange r = cm::attention_range(pos, d_params[0] + int(gridDim.y), d_params[1],
                                            prm.window, prm.drop_newest, prm.whole_chunk);
  const int chunk = r.t1 > r.t0 ? (r.t1 - r.t0 + n_split - 1) / n_split : 0;
  const int t0 = r.t0 + sp * chunk, t1 = min(r.t1, t0 + chunk);

  float qv[EPL];
  const float* qh = q + (int64_t{t} * n_head + h) * HD;
#pragma unroll
  for (int e = 0; e < EPL; ++e) qv[e] = lane_has<HD>(lane, e) ? qh[lane + 32 * e] : 0.0f;

  float m = -INFINITY, l = 0.0f, acc[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) acc[e] = 0.0f;
  for (int p = t0 + warp; p < t1; p += kAttnWarps) {
    const float* kr = k_cache + int64_t{p} * kv_dim + kvh * HD;
    const float* vr = v_cache + int64_t{p} * kv_dim + kvh * HD;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; ++e)
      s = cm::fma_rn(qv[e], lane_has<HD>(lane, e) ? kr[lane + 32 * e] : 0.0f, s);
    s = __fmul_rn(warp_sum(s), prm.scale);
    float vv[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) vv[e] = lane_has<HD>(lane, e) ? vr[lane + 32 * e] : 0.0f;
    if (prm.softmax_no_max) {
      float ev[EPL];
      cm::softmax_add_no_max(&m, &l, acc, s, vv, ev, EPL);
    } else {
      cm::softmax_merge(&m, &l, acc, s, 1.0f, vv, EPL);
    }
  }

  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps], sm_acc[kAttnWarps][EPL * 32];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < EPL; ++e) sm_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
  for (int w = 1; w < kAttnWarps; ++w) {
    float a2[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) a2[e] = sm_acc[w][lane + 32 * e];
    cm::softmax_merge(&m, &l, acc, sm_m[w], sm_l[w], a2, EPL);
  }
  float* out = partial + ((int64_t{t} * n_head + h) * n_split + sp) * (HD + 2);
#pragma unroll
  for (int e = 0; e < EPL; ++e)
    if (lane_has<HD>(lane, e)) out[lane + 32 * e] = acc[e];
  if (lane == 0) {
    out[HD] = m;
    out[HD + 1] = l;
  }
}

__global__ void attention_merge_k(const float* partial, float* out, int n_head, int hd,
                                  int n_split) {
  const int h = blockIdx.x, t = blockIdx.y, e = threadIdx.x;
  float m = -INFINITY, l = 0.0f, a = 0.0f;
  const float* base = partial + (int64_t{t} * n_head + h) * n_split * (hd + 2);
  for (int sp = 0; sp < n_split; ++sp) {
    const float* p = base + int64_t{sp} * (hd + 2);
    cm::softmax_merge(&m, &l, &a, p[hd], p[hd + 1], p + e, 1);
  }
  out[(int64_t{t} * n_head + h) * hd + e] = l > 0.0f ? __fdiv_rn(a, l) : 0.0f;
}

__global__ void gated_act_k(float* gate, const float* up, int64_t n, bool gelu) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) gate[i] = gelu ? cm::gelu_mul(gate[i], up[i]) : cm::silu_mul(gate[i], up[i]);
}

__global__ void add_bias_k(float* y, const float* bias, int64_t total, int n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < total) y[i] = cm::residual_add(y[i], bias[i % n]);
}

__global__ void softcap_k(float* x, int64_t n, double cap) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cm::softcap(x[i], cap);
}

__global__ void round_fp16_k(float* x, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cm::round_fp16(x[i]);
}

__global__ void add_fp16_partial_k(float* acc, const float* part, int64_t n, bool first) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = cm::add_rn(first ? 0.0f : acc[i], cm::round_fp16(part[i]));
}

constexpr int kArgmaxThreads = 1024;
__global__ void argmax_k(const float* logits, int n, int32_t* out) {
  __shared__ float sv[kArgmaxThreads];
  __shared__ int32_t si[kArgmaxThreads];
  cm::ArgMax best{0.0f, -1};
  for (int i = threadIdx.x; i < n; i += kArgmaxThreads)
    best = cm::argmax_merge(best, cm::argmax_leaf(logits[i], i));
  sv[threadIdx.x] = best.v;
  si[threadIdx.x] = best.id;
  __syncthreads();
  for (int s = kArgmaxThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const cm::ArgMax r = cm::argmax_merge({sv[threadIdx.x], si[threadIdx.x]},
                                            {sv[threadIdx.x + s], si[threadIdx.x + s]});
      sv[threadIdx.x] = r.v;
      si[threadIdx.x] = r.id;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = si[0];
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

cudaError_t launch_get_rows(WType type, const void* table, const int32_t* d_tokens, int n_tokens,
                            int n_embd, double scale, float* x, cudaStream_t stream) {
  return dispatch(type, [&](auto c) {
    get_rows_k<decltype(c)::value>
        <<<dim3(blocks_for(n_embd, 256), static_cast<unsigned>(n_tokens)), 256, 0, stream>>>(
            static_cast<const uint8_t*>(table), d_tokens, n_embd, scale, x);
  });
}

cudaError_t launch_add_rmsnorm(float* x, const float* delta, const float* w, float* out, int n_rows,
                               int n, double eps, cudaStream_t stream) {
  add_rmsnorm_k<<<static_cast<unsigned>(n_rows), kNormThreads, 0, stream>>>(x, delta, w, out, n,
                                                                            eps);
  return cudaGetLastError();
}

cudaError_t launch_matvec(WType type, const void* W, const float* x, float* y, int n_out, int n_in,
                          cudaStream_t stream) {
  return dispatch(type, [&](auto c) {
    matvec_k<decltype(c)::value><<<blocks_for(n_out, kMatvecWarps), 32 * kMatvecWarps, 0, stream>>>(
        static_cast<const uint8_t*>(W), x, y, n_out, n_in);
  });
}

cudaError_t launch_dequantize(WType type, const void* W, float* out, int n_rows, int n_in,
                              cudaStream_t stream) {
  const int64_t total = int64_t{n_rows} * n_in;
  return dispatch(type, [&](auto c) {
    dequantize_k<decltype(c)::value><<<blocks_for(total, 256), 256, 0, stream>>>(
        static_cast<const uint8_t*>(W), out, total, n_in);
  });
}

cudaError_t launch_rope_store(float* q, const float* k, const float* v, float* k_cache,
                              float* v_cache, const double* rope_cs, const int32_t* d_params,
                              int n_tokens, const RopeParams& p, cudaStream_t stream) {
  rope_store_k<<<static_cast<unsigned>(n_tokens), 256, 0, stream>>>(q, k, v, k_cache, v_cache,
                                                                    rope_cs, d_params, p);
  return cudaGetLastError();
}

cudaError_t launch_attention(const float* q, const float* k_cache, const float* v_cache,
                             float* partial, float* out, const int32_t* d_params, int n_tokens,
                             const AttnParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_head), static_cast<unsigned>(n_tokens),
                  static_cast<unsigned>(p.n_split));
  auto run = [&](auto hd) {
    attention_k<decltype(hd)::value>
        <<<grid, 32 * kAttnWarps, 0, stream>>>(q, k_cache, v_cache, partial, d_params, p);
  };
  switch (p.head_dim) {
    case 16:
      run(std::integral_constant<int, 16>{});
      break;
    case 32:
      run(std::integral_constant<int, 32>{});
      break;
    case 64:
      run(std::integral_constant<int, 64>{});
      break;
    case 128:
      run(std::integral_constant<int, 128>{});
      break;
    case 256:
      run(std::integral_constant<int, 256>{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  attention_merge_k<<<dim3(static_cast<unsigned>(p.n_head), static_cast<unsigned>(n_tokens)),
                      static_cast<unsigned>(p.head_dim), 0, stream>>>(partial, out, p.n_head,
                                                                      p.head_dim, p.n_split);
  return cudaGetLastError();
}

cudaError_t launch_gated_act(float* gate, const float* up, int64_t n, bool gelu,
                             cudaStream_t stream) {
  gated_act_k<<<blocks_for(n, 256), 256, 0, stream>>>(gate, up, n, gelu);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* y, const float* bias, int n_rows, int n, cudaStream_t stream) {
  const int64_t total = int64_t{n_rows} * n;
  add_bias_k<<<blocks_for(total, 256), 256, 0, stream>>>(y, bias, total, n);
  return cudaGetLastError();
}

cudaError_t launch_softcap(float* x, int64_t n, double cap, cudaStream_t stream) {
  softcap_k<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, cap);
  return cudaGetLastError();
}

cudaError_t launch_round_fp16(float* x, int64_t n, cudaStream_t stream) {
  round_fp16_k<<<blocks_for(n, 256), 256, 0, stream>>>(x, n);
  return cudaGetLastError();
}

cudaError_t launch_add_fp16_partial(float* acc, const float* part, int64_t n, bool first,
                                    cudaStream_t stream) {
  add_fp16_partial_k<<<blocks_for(n, 256), 256, 0, stream>>>(acc, part, n, first);
  return cudaGetLastError();
}

cudaError_t launch_argmax(const float* logits, int n, int32_t* out, cudaStream_t stream) {
  argmax_k<<<1, kArgmaxThreads, 0, stream>>>(logits, n, out);
  return cudaGetLastError();
}

}  // namespace touchstone::cuda
