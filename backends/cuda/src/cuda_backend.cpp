// cuda_backend.cpp - the CUDA backend behind the session contract
// (touchstone/backend_abi.h) through touchstone::BackendAdapter, which applies
// the shared argument checks. Built as libtouchstone_backend_cuda.so.
//
//  * One forward pass for every family: it reads touchstone::ModelConfig
//    (read_model_config, as reference_forward.cpp and cpu_simd) and switches
//    the features on from it (NeoX / partial RoPE, rope_freqs, linear scaling,
//    per-layer RoPE base and sliding window, Q/K/V biases, QK-norm, post-norms,
//    GeGLU, embedding / attention scale, logit soft-capping; fused QKV and
//    gate|up matrices are split at load as row ranges of one upload).
//  * The fault catalog (touchstone/faults.h) but the serving faults, and the
//    ABI v4 layer taps (recorded on the device with plain launches).
//  * Weights are uploaded once per weight path (lazily, at the first session of
//    that path): full_precision = every tensor dequantized to fp32 on the host
//    with touchstone::gguf (the reference's own weights); quantized = GGUF
//    blocks uploaded as they are and dequantized in registers by the kernels.
//  * One token (decode, or a prefill of one token) runs custom kernels only:
//    matrix-vector products with one warp per row (kernels.cu). Prefill of
//    several tokens uses cuBLAS SGEMM with CUBLAS_PEDANTIC_MATH (fp32 compute,
//    never TF32); quantized matrices are first dequantized to fp32 scratch.
//  * The decode step is captured once per session as a CUDA graph (the kernels
//    read the position and the token from device memory), so decode does no
//    allocation and one graph launch per token. TOUCHSTONE_CUDA_GRAPH=0
//    disables the graph (plain stream launches, same kernels, same numbers).
//  * Every CUDA / cuBLAS failure is a StatusError naming the device, the call
//    and the CUDA error string; allocation failures report the sizes.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels.h"
#include "touchstone/backend_abi.h"
#include "touchstone/backend_impl.h"
#include "touchstone/error.h"
#include "touchstone/faults.h"
#include "touchstone/gguf.h"
#include "touchstone/model_config.h"
#include "touchstone/quant.h"

namespace {

using touchstone::abi::StatusError;
using touchstone::cuda_math::WType;
namespace cm = touchstone::cuda_math;
namespace tc = touchstone::cuda;
namespace gguf = touchstone::gguf;

constexpr int kMaxBatch = 256;     // prefill chunk (tokens per forward)
constexpr int kDecodeSplits = 16;  // split-K partitions of the KV cache for one token
constexpr int kPrefillSplits = 4;

// ---- errors ----------------------------------------------------------------------
std::string current_device() {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) return "device ?";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return fmt::format("device {}", dev);
  return fmt::format("device {} ({})", dev, p.name);
}

[[noreturn]] void cuda_fail(cudaError_t e, const char* call) {
  const ts_status st = e == cudaErrorMemoryAllocation ? TS_ERR_OUT_OF_MEMORY : TS_ERR_DEVICE;
  throw StatusError(st, fmt::format("CUDA error on {}: {} failed: {}: {}", current_device(), call,
                                    cudaGetErrorName(e), cudaGetErrorString(e)));
}

[[noreturn]] void cublas_fail(cublasStatus_t s, const char* call) {
  const ts_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? TS_ERR_OUT_OF_MEMORY : TS_ERR_DEVICE;
  throw StatusError(st, fmt::format("cuBLAS error on {}: {} failed: {}: {}", current_device(), call,
                                    cublasGetStatusName(s), cublasGetStatusString(s)));
}

#define TS_CUDA(call)                                  \
  do {                                                 \
    const cudaError_t ts_e_ = (call);                  \
    if (ts_e_ != cudaSuccess) cuda_fail(ts_e_, #call); \
  } while (0)
#define TS_CUBLAS(call)                                            \
  do {                                                             \
    const cublasStatus_t ts_s_ = (call);                           \
    if (ts_s_ != CUBLAS_STATUS_SUCCESS) cublas_fail(ts_s_, #call); \
  } while (0)

// Selected device (TOUCHSTONE_CUDA_DEVICE, default 0); TS_ERR_DEVICE when none.
int require_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw StatusError(TS_ERR_DEVICE, fmt::format("no CUDA device: cudaGetDeviceCount: {}: {}",
                                                 cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  if (n <= 0)
    throw StatusError(TS_ERR_DEVICE, "no CUDA device: cudaGetDeviceCount found 0 devices");
  int dev = 0;
  if (const char* s = std::getenv("TOUCHSTONE_CUDA_DEVICE"); s && *s) dev = std::atoi(s);
  if (dev < 0 || dev >= n) {
    throw StatusError(
        TS_ERR_DEVICE,
        fmt::format("TOUCHSTONE_CUDA_DEVICE={} but cudaGetDeviceCount found {} device(s)", dev, n));
  }
  TS_CUDA(cudaSetDevice(dev));
  return dev;
}

bool env_flag(const char* name, bool dflt) {
  const char* s = std::getenv(name);
  if (!s || !*s) return dflt;
  return std::string(s) != "0";
}

// ---- device memory ------------------------------------------------------------------
struct CudaFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
using DevPtr = std::unique_ptr<void, CudaFree>;

DevPtr dev_alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw StatusError(
        TS_ERR_OUT_OF_MEMORY,
        fmt::format("out of device memory on {}: cudaMalloc of {} bytes ({:.1f} MiB) for {} failed "
                    "({:.1f} MiB free of {:.1f} MiB)",
                    current_device(), bytes, double(bytes) / 1048576.0, what,
                    double(free_b) / 1048576.0, double(total_b) / 1048576.0));
  }
  if (e != cudaSuccess) cuda_fail(e, "cudaMalloc");
  return DevPtr(p);
}

struct HostFree {
  void operator()(void* p) const noexcept { cudaFreeHost(p); }
};
using HostPtr = std::unique_ptr<void, HostFree>;

HostPtr host_alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw StatusError(TS_ERR_OUT_OF_MEMORY,
                      fmt::format("out of pinned host memory: cudaMallocHost of {} bytes "
                                  "for {} failed",
                                  bytes, what));
  }
  if (e != cudaSuccess) cuda_fail(e, "cudaMallocHost");
  return HostPtr(p);
}

template <typename T>
T* as(const DevPtr& p) {
  return static_cast<T*>(p.get());
}

// ---- weights on the device -------------------------------------------------------------
struct DevMatrix {
  WType type = WType::F32;
  int n_out = 0, n_in = 0;
  const void* ptr = nullptr;
};

// Rows [begin, begin + n) of m (a fused matrix split at load: same storage).
DevMatrix sub_rows(const DevMatrix& m, int begin, int n) {
  DevMatrix r = m;
  r.n_out = n;
  r.ptr = static_cast<const uint8_t*>(m.ptr) + cm::row_bytes(m.type, m.n_in) * begin;
  return r;
}

// One layer's weights (touchstone::ModelConfig decides which are present; an
// absent vector is nullptr).
struct DevLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;          // qkv_bias
  const float *q_norm = nullptr, *k_norm = nullptr;                 // qk_norm ([head_dim])
  const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // post_norms
  DevMatrix wq, wk, wv, wo, gate, up, down;
};

struct DevWeights {
  std::vector<DevPtr> owned;
  size_t bytes = 0;
  int64_t max_matrix_elems = 0;  // largest n_out * n_in (dequantization scratch)
  DevMatrix tok_embd, lm_head;
  const float* out_norm = nullptr;
  std::vector<DevLayer> layers;
};

bool device_type(gguf::TensorType t, WType* out) {
  switch (t) {
    case gguf::TensorType::F32:
      *out = WType::F32;
      return true;
    case gguf::TensorType::F16:
      *out = WType::F16;
      return true;
    case gguf::TensorType::Q4_0:
      *out = WType::Q4_0;
      return true;
    case gguf::TensorType::Q4_1:
      *out = WType::Q4_1;
      return true;
    case gguf::TensorType::Q5_0:
      *out = WType::Q5_0;
      return true;
    case gguf::TensorType::Q8_0:
      *out = WType::Q8_0;
      return true;
    case gguf::TensorType::Q4_K:
      *out = WType::Q4_K;
      return true;
    case gguf::TensorType::Q6_K:
      *out = WType::Q6_K;
      return true;
    default:
      return false;
  }
}

// quant_scale_min_swap / nibble_order: every block of one matrix as a kernel with
// that bug reads them (cuda_math::corrupt_q4_block). False when the fault does
// not apply to the type (no 4-bit quants, or no min for the swap).
bool corrupt_blocks(WType t, const touchstone::Faults& f, std::vector<uint8_t>& bytes) {
  cm::Q4Layout lay{};
  if (!cm::q4_layout(t, &lay) || (f.quant_scale_min_swap && !lay.has_min)) return false;
  const auto bb = size_t(lay.block_bytes);
  for (size_t b = 0; b + bb <= bytes.size(); b += bb)
    cm::corrupt_q4_block(bytes.data() + b, lay, f.quant_scale_min_swap);
  return true;
}

class WeightLoader {
 public:
  // corrupt: a quantized-only fault whose blocks are uploaded corrupted (or null).
  WeightLoader(const gguf::File& f, bool quantized, DevWeights& w,
               const touchstone::Faults* corrupt = nullptr)
      : f_(f), quantized_(quantized), w_(w), corrupt_(corrupt) {}
  int n_corrupted() const { return n_corrupted_; }

  const void* upload(const void* src, size_t bytes, const std::string& what) {
    DevPtr p = dev_alloc(bytes, what);
    TS_CUDA(cudaMemcpy(p.get(), src, bytes, cudaMemcpyHostToDevice));
    w_.bytes += bytes;
    w_.owned.push_back(std::move(p));
    return w_.owned.back().get();
  }

  const gguf::TensorInfo& info(const std::string& name, uint64_t n0, uint64_t n1) {
    const gguf::TensorInfo& t = f_.tensor(name);
    const bool ok = n1 == 0 ? (t.shape.size() == 1 && t.shape[0] == n0)
                            : (t.shape.size() == 2 && t.shape[0] == n0 && t.shape[1] == n1);
    if (!ok) {
      std::string s;
      for (uint64_t d : t.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
      throw StatusError(
          TS_ERR_IO, fmt::format("{}: tensor {} has shape [{}], expected [{}{}]", f_.path(), name,
                                 s, n0, n1 ? ", " + std::to_string(n1) : std::string()));
    }
    return t;
  }

  const float* vec(const std::string& name, int n) {
    const gguf::TensorInfo& t = info(name, uint64_t(n), 0);
    const std::vector<float> v = gguf::dequantize(f_, t);
    return static_cast<const float*>(upload(v.data(), v.size() * sizeof(float), name));
  }

  // ggml shape {n_in, n_out}: n_out rows of n_in elements.
  DevMatrix mat(const std::string& name, int n_out, int n_in) {
    const gguf::TensorInfo& t = info(name, uint64_t(n_in), uint64_t(n_out));
    DevMatrix m;
    m.n_out = n_out;
    m.n_in = n_in;
    w_.max_matrix_elems = std::max(w_.max_matrix_elems, int64_t{n_out} * n_in);
    if (n_in % cm::kQK != 0) {  // the kernels cut rows into 32-element chunks
      throw StatusError(TS_ERR_UNSUPPORTED,
                        fmt::format("{}: tensor {} row length {} is not a multiple of {}",
                                    f_.path(), name, n_in, cm::kQK));
    }
    WType wt = WType::F32;
    if (!quantized_) {
      const std::vector<float> v = gguf::dequantize(f_, t);
      m.type = WType::F32;
      m.ptr = upload(v.data(), v.size() * sizeof(float), name);
      return m;
    }
    if (!device_type(t.type, &wt)) {
      throw StatusError(
          TS_ERR_UNSUPPORTED,
          fmt::format(
              "{}: tensor {} has type {}; the cuda quantized path reads F32, F16, Q4_0, Q4_1, "
              "Q5_0, Q8_0, Q4_K, Q6_K (use --weights full_precision)",
              f_.path(), name, gguf::type_name(t.type)));
    }
    const int block = (wt == WType::Q4_K || wt == WType::Q6_K) ? cm::kQK_K : cm::kQK;
    if (n_in % block != 0 || n_in % cm::kQK != 0) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        fmt::format("{}: tensor {} row length {} is not a multiple of {}",
                                    f_.path(), name, n_in, std::max(block, cm::kQK)));
    }
    const std::span<const uint8_t> bytes = f_.tensor_data(t);
    const auto expect = static_cast<size_t>(cm::row_bytes(wt, n_in) * n_out);
    if (bytes.size() != expect) {
      throw StatusError(TS_ERR_IO, fmt::format("{}: tensor {} holds {} bytes, expected {}",
                                               f_.path(), name, bytes.size(), expect));
    }
    m.type = wt;
    if (corrupt_) {
      std::vector<uint8_t> copy(bytes.begin(), bytes.end());
      if (corrupt_blocks(wt, *corrupt_, copy)) {
        ++n_corrupted_;
        m.ptr = upload(copy.data(), copy.size(), name);
        return m;
      }
    }
    m.ptr = upload(bytes.data(), bytes.size(), name);
    return m;
  }

 private:
  const gguf::File& f_;
  bool quantized_;
  DevWeights& w_;
  const touchstone::Faults* corrupt_;
  int n_corrupted_ = 0;
};

}  // namespace

struct CudaModel {
  CudaModel(gguf::File f, touchstone::ModelConfig c, int dev)
      : file(std::move(f)), cfg(std::move(c)), device(dev) {
    if (cfg.rope_freq_factors) {  // rope_freqs.weight: n_rot / 2 divisors (llama3 scaling)
      const gguf::TensorInfo& t = file.tensor("rope_freqs.weight");
      rope_freqs = gguf::dequantize(file, t);
      if (rope_freqs.size() != size_t(cfg.n_rot / 2)) {
        throw StatusError(TS_ERR_IO,
                          fmt::format("{}: rope_freqs.weight holds {} values, expected {}",
                                      file.path(), rope_freqs.size(), cfg.n_rot / 2));
      }
    }
  }
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;
  ~CudaModel() { cudaSetDevice(device); }  // the weights are freed on their device
  int32_t n_vocab() const { return cfg.n_vocab; }
  gguf::File file;
  touchstone::ModelConfig cfg;
  int device = 0;
  std::vector<float> rope_freqs;                       // empty: no frequency factors
  std::array<std::unique_ptr<DevWeights>, 2> weights;  // by ts_weight_path
};

namespace {

// One layer's tensors, named and shaped as reference/model/src/model_weights.cpp
// reads them (fused attn_qkv / gate|up ffn_up split by rows).
DevLayer load_layer(WeightLoader& ld, const touchstone::ModelConfig& c, int l) {
  const int d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const std::string p = "blk." + std::to_string(l) + ".";
  DevLayer L;
  L.attn_norm = ld.vec(p + "attn_norm.weight", d);
  if (c.fused_qkv) {
    const DevMatrix qkv = ld.mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d);
    L.wq = sub_rows(qkv, 0, q_dim);
    L.wk = sub_rows(qkv, q_dim, kv_dim);
    L.wv = sub_rows(qkv, q_dim + kv_dim, kv_dim);
  } else {
    L.wq = ld.mat(p + "attn_q.weight", q_dim, d);
    L.wk = ld.mat(p + "attn_k.weight", kv_dim, d);
    L.wv = ld.mat(p + "attn_v.weight", kv_dim, d);
  }
  if (c.qkv_bias) {
    L.bq = ld.vec(p + "attn_q.bias", q_dim);
    L.bk = ld.vec(p + "attn_k.bias", kv_dim);
    L.bv = ld.vec(p + "attn_v.bias", kv_dim);
  }
  if (c.qk_norm) {
    L.q_norm = ld.vec(p + "attn_q_norm.weight", hd);
    L.k_norm = ld.vec(p + "attn_k_norm.weight", hd);
  }
  L.wo = ld.mat(p + "attn_output.weight", d, q_dim);
  if (c.post_norms) L.post_attn_norm = ld.vec(p + "post_attention_norm.weight", d);
  L.ffn_norm = ld.vec(p + "ffn_norm.weight", d);
  if (c.fused_gate_up) {
    const DevMatrix gu = ld.mat(p + "ffn_up.weight", 2 * c.n_ff, d);
    L.gate = sub_rows(gu, 0, c.n_ff);
    L.up = sub_rows(gu, c.n_ff, c.n_ff);
  } else {
    L.gate = ld.mat(p + "ffn_gate.weight", c.n_ff, d);
    L.up = ld.mat(p + "ffn_up.weight", c.n_ff, d);
  }
  L.down = ld.mat(p + "ffn_down.weight", d, c.n_ff);
  if (c.post_norms) L.post_ffn_norm = ld.vec(p + "post_ffw_norm.weight", d);
  return L;
}

// Every tensor of one weight path on the device. corrupt: a quantized-only fault
// (quantized path) whose blocks are uploaded corrupted; TS_ERR_UNSUPPORTED when
// the model has no matrix it applies to.
std::unique_ptr<DevWeights> load_weights(const CudaModel& m, bool quantized,
                                         const touchstone::Faults* corrupt) {
  const touchstone::ModelConfig& c = m.cfg;
  auto w = std::make_unique<DevWeights>();
  WeightLoader ld(m.file, quantized, *w, corrupt);
  w->tok_embd = ld.mat("token_embd.weight", c.n_vocab, c.n_embd);
  w->out_norm = ld.vec("output_norm.weight", c.n_embd);
  w->lm_head = c.tied_embeddings ? w->tok_embd : ld.mat("output.weight", c.n_vocab, c.n_embd);
  for (int l = 0; l < c.n_layer; ++l) w->layers.push_back(load_layer(ld, c, l));
  if (corrupt && ld.n_corrupted() == 0) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      fmt::format("fault '{}': this model has no quantized matrix it applies to "
                                  "(Q4_0/Q4_1/Q4_K)",
                                  corrupt->name));
  }
  return w;
}

const DevWeights& model_weights(CudaModel& m, ts_weight_path path) {
  auto& slot = m.weights[path == TS_WEIGHTS_QUANTIZED ? 1 : 0];
  if (!slot) slot = load_weights(m, path == TS_WEIGHTS_QUANTIZED, nullptr);
  return *slot;
}

}  // namespace

struct CudaSession {
  CudaModel* model = nullptr;
  const DevWeights* w = nullptr;
  std::unique_ptr<DevWeights> own_w;  // a quantized-only fault's corrupted copy (else null)
  bool quantized = false;
  int max_ctx = 0;
  int pos = 0;
  int kv_len = 0;  // high-water mark of written KV entries (the rewind_noop fault reads it)
  bool use_graph = true;
  bool check_argmax = false;
  touchstone::Faults faults;
  int split = 1;  // split-K slices of every matrix product (> 1: a reduction-order fault)
  bool taps_on = false, taps_recorded = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cudaGraphExec_t graph = nullptr;
  // Device buffers (allocated once at open_session).
  DevPtr k_cache, v_cache, x, xn, q, k, v, att, gate, up, tmp, logits, partial, deq, params, argmax,
      split_part, taps;
  std::vector<DevPtr> rope_tables;        // one per distinct (base, scale) of the layers
  std::vector<const double*> layer_rope;  // [n_layer]: the layer's table
  // Pinned host staging.
  HostPtr h_params, h_logits, h_argmax;

  CudaSession() = default;
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;
  ~CudaSession() {
    if (model) cudaSetDevice(model->device);
    if (stream) cudaStreamSynchronize(stream);
    if (graph) cudaGraphExecDestroy(graph);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {

void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(e, what);
}

// M as fp32 row-major [n_out][n_in] on the device (a quantized matrix is
// dequantized into the session's scratch first).
const float* dense(CudaSession& s, const DevMatrix& M) {
  if (M.type == WType::F32) return static_cast<const float*>(M.ptr);
  check_launch(tc::launch_dequantize(M.type, M.ptr, as<float>(s.deq), M.n_out, M.n_in, s.stream),
               "dequantize kernel launch");
  return as<float>(s.deq);
}

// out[n][n_out] = A[:, c0:c0+nc] . in[n][c0:c0+nc] (cuBLAS SGEMM, fp32). Row-major A
// [n_out][n_in] is column-major A^T (lda = n_in); activations are column-major
// [n_in][n]; out column-major [n_out][n] = row-major [n][n_out].
void gemm_cols(CudaSession& s, const float* A, const DevMatrix& M, const float* in, float* out,
               int n, int c0, int nc) {
  const float one = 1.0f, zero = 0.0f;
  TS_CUBLAS(cublasSgemm(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, M.n_out, n, nc, &one, A + c0, M.n_in,
                        in + c0, M.n_in, &zero, out, M.n_out));
}

// out[n][n_out] = M . in[n][n_in]  (row-major activations). Faults: the
// reduction-order faults (s.split > 1: the columns cut into s.split slices of
// whole 32-element chunks, each slice's product rounded to fp16, the slices
// added in order in fp32, as vulkan's FAULT_SPLIT_K), fp16_accumulation
// (outputs rounded through fp16).
void linear(CudaSession& s, const DevMatrix& M, const float* in, float* out, int n) {
  const int64_t n_outs = int64_t{n} * M.n_out;
  if (s.split > 1) {
    const float* A = dense(s, M);
    const int nb = M.n_in / cm::kQK;
    for (int k = 0; k < s.split; ++k) {
      const int b0 = nb * k / s.split, b1 = nb * (k + 1) / s.split;
      if (b1 == b0) continue;
      gemm_cols(s, A, M, in, as<float>(s.split_part), n, b0 * cm::kQK, (b1 - b0) * cm::kQK);
      check_launch(
          tc::launch_add_fp16_partial(out, as<float>(s.split_part), n_outs, b0 == 0, s.stream),
          "add_fp16_partial");
    }
  } else if (n == 1) {
    check_launch(tc::launch_matvec(M.type, M.ptr, in, out, M.n_out, M.n_in, s.stream),
                 "matvec kernel launch");
  } else {
    gemm_cols(s, dense(s, M), M, in, out, n, 0, M.n_in);
  }
  if (s.faults.fp16_accumulation)
    check_launch(tc::launch_round_fp16(out, n_outs, s.stream), "round_fp16");
}

// linear() plus an optional bias ([n_out], Q/K/V biases).
void linear_bias(CudaSession& s, const DevMatrix& M, const float* bias, const float* in, float* out,
                 int n) {
  linear(s, M, in, out, n);
  if (bias) check_launch(tc::launch_add_bias(out, bias, n, M.n_out, s.stream), "add_bias");
}

// Layer taps (ABI v4): the last of the n rows of `rows` into the record
// [n_layer][TS_TAP_POINTS][n_embd] (rows = nullptr: zeros, a skipped layer).
void tap(CudaSession& s, int layer, int point, const float* rows, int n) {
  if (!s.taps_on) return;
  const size_t d = size_t(s.model->cfg.n_embd);
  float* dst = as<float>(s.taps) + (size_t(layer) * TS_TAP_POINTS + size_t(point)) * d;
  if (!rows) {
    TS_CUDA(cudaMemsetAsync(dst, 0, d * sizeof(float), s.stream));
    return;
  }
  TS_CUDA(cudaMemcpyAsync(dst, rows + size_t(n - 1) * d, d * sizeof(float),
                          cudaMemcpyDeviceToDevice, s.stream));
}

enum class Logits { None, Last, All };

// Attention half of layer l for the n tokens of the batch: x += attn(norm(x))
// is left pending (the block output in s.tmp; the next add_rmsnorm adds it).
void attention_block(CudaSession& s, int l, int n, int rope_origin) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevLayer& L = s.w->layers[size_t(l)];
  const double eps = c.rms_norm_eps * s.faults.rms_eps_scale;
  const int hd = c.head_dim, kv_dim = c.n_head_kv * hd;
  const size_t layer_kv = size_t(s.max_ctx) * size_t(kv_dim);
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  float *q = as<float>(s.q), *k = as<float>(s.k), *v = as<float>(s.v);
  float* kc = as<float>(s.k_cache) + size_t(l) * layer_kv;
  float* vc = as<float>(s.v_cache) + size_t(l) * layer_kv;
  check_launch(tc::launch_add_rmsnorm(x, l == 0 ? nullptr : tmp, L.attn_norm, xn, n, c.n_embd, eps,
                                      s.stream),
               "add_rmsnorm");
  if (l > 0) tap(s, l - 1, TS_TAP_RESIDUAL, x, n);
  linear_bias(s, L.wq, L.bq, xn, q, n);
  linear_bias(s, L.wk, L.bk, xn, k, n);
  linear_bias(s, L.wv, L.bv, xn, v, n);
  if (L.q_norm) {  // per-head RMSNorm of q and k (in place)
    check_launch(tc::launch_add_rmsnorm(q, nullptr, L.q_norm, q, n * c.n_head, hd, eps, s.stream),
                 "q_norm");
    check_launch(
        tc::launch_add_rmsnorm(k, nullptr, L.k_norm, k, n * c.n_head_kv, hd, eps, s.stream),
        "k_norm");
  }
  tc::RopeParams rp;
  rp.n_head = c.n_head, rp.n_head_kv = c.n_head_kv, rp.head_dim = hd, rp.n_rot = c.n_rot;
  rp.neox = (c.rope_style == touchstone::RopeStyle::NeoX) != s.faults.rope_layout;
  rp.rope_origin = rope_origin, rp.write_offset = s.faults.kv_write_next ? 1 : 0;
  rp.max_ctx = s.max_ctx;
  check_launch(tc::launch_rope_store(q, k, v, kc, vc, s.layer_rope[size_t(l)],
                                     as<int32_t>(s.params), n, rp, s.stream),
               "rope_store");
  tc::AttnParams ap;
  ap.n_head = c.n_head, ap.n_head_kv = c.n_head_kv, ap.head_dim = hd;
  ap.n_split = n == 1 ? kDecodeSplits : kPrefillSplits;
  ap.scale = static_cast<float>(s.faults.attention_scale ? 1.0 / double(hd) : c.attn_scale);
  ap.window = c.layers[size_t(l)].sliding_window;
  ap.drop_newest = s.faults.kv_off_by_one, ap.gqa_modulo = s.faults.gqa_mapping;
  ap.softmax_no_max = s.faults.softmax_no_max, ap.whole_chunk = s.faults.causal_mask;
  check_launch(tc::launch_attention(q, kc, vc, as<float>(s.partial), as<float>(s.att),
                                    as<int32_t>(s.params), n, ap, s.stream),
               "attention");
  linear(s, L.wo, as<float>(s.att), tmp, n);
  if (L.post_attn_norm) {
    check_launch(
        tc::launch_add_rmsnorm(tmp, nullptr, L.post_attn_norm, tmp, n, c.n_embd, eps, s.stream),
        "post_attn_norm");
  }
  tap(s, l, TS_TAP_ATTN_OUT, tmp, n);
}

// FFN half of layer l: adds the pending attention output to x, leaves the FFN
// output pending in s.tmp.
void ffn_block(CudaSession& s, int l, int n) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevLayer& L = s.w->layers[size_t(l)];
  const double eps = c.rms_norm_eps * s.faults.rms_eps_scale;
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  check_launch(tc::launch_add_rmsnorm(x, tmp, L.ffn_norm, xn, n, c.n_embd, eps, s.stream),
               "add_rmsnorm");
  linear(s, L.gate, xn, as<float>(s.gate), n);
  linear(s, L.up, xn, as<float>(s.up), n);
  const bool gelu = c.ffn_activation == touchstone::FfnActivation::GeluTanh;
  check_launch(
      tc::launch_gated_act(as<float>(s.gate), as<float>(s.up), int64_t{n} * c.n_ff, gelu, s.stream),
      "gated_act");
  linear(s, L.down, as<float>(s.gate), tmp, n);
  if (L.post_ffn_norm) {
    check_launch(
        tc::launch_add_rmsnorm(tmp, nullptr, L.post_ffn_norm, tmp, n, c.n_embd, eps, s.stream),
        "post_ffn_norm");
  }
  tap(s, l, TS_TAP_FFN_OUT, tmp, n);
}

// Enqueues one forward pass of n tokens (ids and start position already in
// s.params on the device; rope_origin: the prefill_position_reset fault's
// origin, else 0). Logits go to s.logits.
void enqueue_forward(CudaSession& s, int n, Logits mode, int rope_origin = 0) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevWeights& w = *s.w;
  const int d = c.n_embd;
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  check_launch(tc::launch_get_rows(w.tok_embd.type, w.tok_embd.ptr, as<int32_t>(s.params) + 2, n, d,
                                   c.embd_scale, x, s.stream),
               "get_rows");
  const int n_layer = s.faults.last_layer_skipped ? c.n_layer - 1 : c.n_layer;
  for (int l = 0; l < n_layer; ++l) {
    attention_block(s, l, n, rope_origin);
    ffn_block(s, l, n);
  }
  check_launch(tc::launch_add_rmsnorm(x, n_layer > 0 ? tmp : nullptr, w.out_norm, xn, n, d,
                                      c.rms_norm_eps * s.faults.rms_eps_scale, s.stream),
               "add_rmsnorm");
  for (int l = std::max(n_layer - 1, 0); l < c.n_layer; ++l) {
    // a skipped layer (fault) adds nothing: zero block outputs, residual unchanged
    if (l >= n_layer) {
      tap(s, l, TS_TAP_ATTN_OUT, nullptr, n);
      tap(s, l, TS_TAP_FFN_OUT, nullptr, n);
    }
    tap(s, l, TS_TAP_RESIDUAL, x, n);
  }
  const int rows = mode == Logits::All ? n : 1;
  if (mode == Logits::All) {
    linear(s, w.lm_head, xn, as<float>(s.logits), n);
  } else if (mode == Logits::Last) {
    linear(s, w.lm_head, xn + size_t(n - 1) * size_t(d), as<float>(s.logits), 1);
  }
  if (mode != Logits::None && c.final_logit_softcap != 0.0) {
    check_launch(tc::launch_softcap(as<float>(s.logits), int64_t{rows} * c.n_vocab,
                                    c.final_logit_softcap, s.stream),
                 "softcap");
  }
  if (s.taps_on) s.taps_recorded = true;
}

// params = [position, KV floor, tokens...] (kernels.h).
void stage_params(CudaSession& s, const int32_t* tokens, int n) {
  auto* hp = static_cast<int32_t*>(s.h_params.get());
  hp[0] = s.pos;
  hp[1] = s.faults.rewind_noop ? s.kv_len : 0;
  std::memcpy(hp + 2, tokens, size_t(n) * sizeof(int32_t));
  TS_CUDA(cudaMemcpyAsync(s.params.get(), hp, size_t(n + 2) * sizeof(int32_t),
                          cudaMemcpyHostToDevice, s.stream));
}

// After a pass of n tokens.
void advance(CudaSession& s, int n) {
  s.pos += n;
  s.kv_len = std::max(s.kv_len, s.pos);
}

// The logits_perturb_1e-3 fault: logit i of position p times
// 1 + noise * fault_noise_sign(p * n_vocab + i) (touchstone/faults.h), fp64, on the host.
void perturb_logits(const CudaSession& s, float* rows, int n_rows, int first_pos) {
  if (s.faults.logit_noise == 0.0) return;
  const size_t V = size_t(s.model->cfg.n_vocab);
  for (int r = 0; r < n_rows; ++r) {
    const uint64_t base = uint64_t(first_pos + r) * uint64_t(V);
    float* row = rows + size_t(r) * V;
    for (size_t i = 0; i < V; ++i) {
      row[i] = static_cast<float>(
          double{row[i]} * (1.0 + s.faults.logit_noise * touchstone::fault_noise_sign(base + i)));
    }
  }
}

void verify_argmax(CudaSession& s, const float* logits) {
  if (!s.check_argmax || s.faults.logit_noise != 0.0) return;  // the device saw unperturbed logits
  const int V = s.model->cfg.n_vocab;
  cm::ArgMax best{0.0f, -1};
  for (int i = 0; i < V; ++i) best = cm::argmax_merge(best, cm::argmax_leaf(logits[i], i));
  const int32_t dev = *static_cast<const int32_t*>(s.h_argmax.get());
  if (dev != best.id) {
    throw StatusError(
        TS_ERR_INTERNAL,
        fmt::format("device argmax {} != host argmax {} of the same logits", dev, best.id));
  }
}

// Captures the decode step (forward + tail) as the session's CUDA graph.
template <typename Tail>
void capture_decode(CudaSession& s, Tail&& enqueue_tail) {
  TS_CUDA(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    enqueue_forward(s, 1, Logits::Last);
    enqueue_tail();
  } catch (...) {
    cudaStreamEndCapture(s.stream, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  TS_CUDA(cudaStreamEndCapture(s.stream, &g));
  const cudaError_t e = cudaGraphInstantiate(&s.graph, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    s.graph = nullptr;
    cuda_fail(e, "cudaGraphInstantiate(decode step)");
  }
}

// Decode one token: graph launch (captured on first use) or plain launches
// (TOUCHSTONE_CUDA_GRAPH=0, layer taps on, or a split-K fault: cuBLAS in decode).
void run_decode(CudaSession& s, int32_t token, float* logits_out) {
  const int V = s.model->cfg.n_vocab;
  auto enqueue_tail = [&] {
    check_launch(tc::launch_argmax(as<float>(s.logits), V, as<int32_t>(s.argmax), s.stream),
                 "argmax");
    TS_CUDA(cudaMemcpyAsync(s.h_logits.get(), s.logits.get(), size_t(V) * sizeof(float),
                            cudaMemcpyDeviceToHost, s.stream));
    TS_CUDA(cudaMemcpyAsync(s.h_argmax.get(), s.argmax.get(), sizeof(int32_t),
                            cudaMemcpyDeviceToHost, s.stream));
  };
  stage_params(s, &token, 1);
  if (s.use_graph && !s.taps_on && s.split <= 1) {
    if (!s.graph) capture_decode(s, enqueue_tail);
    TS_CUDA(cudaGraphLaunch(s.graph, s.stream));
  } else {
    enqueue_forward(s, 1, Logits::Last);
    enqueue_tail();
  }
  TS_CUDA(cudaStreamSynchronize(s.stream));
  std::memcpy(logits_out, s.h_logits.get(), size_t(V) * sizeof(float));
  verify_argmax(s, logits_out);
  perturb_logits(s, logits_out, 1, s.pos);
  advance(s, 1);
}

void run_prefill(CudaSession& s, const int32_t* tokens, int n, bool all_positions,
                 float* logits_out) {
  const size_t V = size_t(s.model->cfg.n_vocab);
  const int start = s.pos;
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (K/V still stored at their own rows).
  const int rope_origin = s.faults.prefill_position_reset && n > 1 ? start : 0;
  for (int off = 0; off < n; off += kMaxBatch) {
    const int cnt = std::min(kMaxBatch, n - off);
    const bool last = off + cnt == n;
    stage_params(s, tokens + off, cnt);
    const Logits mode = all_positions ? Logits::All : (last ? Logits::Last : Logits::None);
    enqueue_forward(s, cnt, mode, rope_origin);
    if (mode == Logits::All) {
      TS_CUDA(cudaMemcpyAsync(logits_out + size_t(off) * V, s.logits.get(),
                              size_t(cnt) * V * sizeof(float), cudaMemcpyDeviceToHost, s.stream));
    } else if (mode == Logits::Last) {
      TS_CUDA(cudaMemcpyAsync(s.h_logits.get(), s.logits.get(), V * sizeof(float),
                              cudaMemcpyDeviceToHost, s.stream));
    }
    TS_CUDA(cudaStreamSynchronize(s.stream));
    if (mode == Logits::Last) std::memcpy(logits_out, s.h_logits.get(), V * sizeof(float));
    advance(s, cnt);
  }
  perturb_logits(s, logits_out, all_positions ? n : 1, all_positions ? start : start + n - 1);
  // logits_row_shift fault: an all-position prefill returns row i-1 as row i.
  if (s.faults.logits_row_shift && all_positions && n > 1)
    std::memmove(logits_out + V, logits_out, size_t(n - 1) * V * sizeof(float));
}

// prefill_greedy: the forward pass as run_prefill (last position's logits stay
// on the device), the argmax kernel (lowest id on ties, NaN never wins), and a
// 4-byte copy back. Not captured as a graph. Under the logits_perturb fault the
// logits come back and the host takes the argmax of the perturbed logits.
int32_t run_greedy(CudaSession& s, const int32_t* tokens, int n) {
  const int V = s.model->cfg.n_vocab;
  if (s.faults.logit_noise != 0.0) {
    std::vector<float> logits(static_cast<size_t>(V));
    run_prefill(s, tokens, n, false, logits.data());
    return touchstone::abi::greedy_argmax(logits.data(), V);
  }
  for (int off = 0; off < n; off += kMaxBatch) {
    const int cnt = std::min(kMaxBatch, n - off);
    const bool last = off + cnt == n;
    stage_params(s, tokens + off, cnt);
    enqueue_forward(s, cnt, last ? Logits::Last : Logits::None,
                    s.faults.prefill_position_reset && n > 1 ? s.pos - off : 0);
    if (last) {
      check_launch(tc::launch_argmax(as<float>(s.logits), V, as<int32_t>(s.argmax), s.stream),
                   "argmax");
      TS_CUDA(cudaMemcpyAsync(s.h_argmax.get(), s.argmax.get(), sizeof(int32_t),
                              cudaMemcpyDeviceToHost, s.stream));
    }
    TS_CUDA(cudaStreamSynchronize(s.stream));
    advance(s, cnt);
  }
  const int32_t tok = *static_cast<const int32_t*>(s.h_argmax.get());
  if (tok < 0 || tok >= V) {
    throw StatusError(TS_ERR_INTERNAL,
                      fmt::format("device argmax returned {} (all logits NaN?)", tok));
  }
  return tok;
}

// ---- the session contract, through touchstone::BackendAdapter ------------------------------
std::string describe_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return e != cudaSuccess
               ? fmt::format("CUDA: no device (cudaGetDeviceCount: {})", cudaGetErrorString(e))
               : std::string("CUDA: no device (cudaGetDeviceCount found 0 devices)");
  }
  int dev = 0;
  if (const char* s = std::getenv("TOUCHSTONE_CUDA_DEVICE"); s && *s) dev = std::atoi(s);
  cudaDeviceProp p{};
  if (dev < 0 || dev >= n || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    return fmt::format("CUDA: device {} not usable ({} device(s))", dev, n);
  }
  return fmt::format(
      "CUDA: {} (device {}, sm_{}{}, {} SMs, {:.1f} GiB; fp32 kernels + cuBLAS pedantic fp32, "
      "decode {})",
      p.name, dev, p.major, p.minor, p.multiProcessorCount,
      double(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
      env_flag("TOUCHSTONE_CUDA_GRAPH", true) ? "as a CUDA graph" : "without graph");
}

// Device buffers and pinned staging of a new session (sizes from the model).
void allocate_buffers(CudaSession& s, const touchstone::ModelConfig& c) {
  const size_t hd = size_t(c.head_dim), d = size_t(c.n_embd), B = kMaxBatch;
  const size_t q_dim = size_t(c.n_head) * hd, kv_dim = size_t(c.n_head_kv) * hd,
               V = size_t(c.n_vocab);
  const size_t kv_bytes = size_t(c.n_layer) * size_t(s.max_ctx) * kv_dim * sizeof(float);
  s.k_cache =
      dev_alloc(kv_bytes, fmt::format("K cache ({} layers x {} positions)", c.n_layer, s.max_ctx));
  s.v_cache =
      dev_alloc(kv_bytes, fmt::format("V cache ({} layers x {} positions)", c.n_layer, s.max_ctx));
  TS_CUDA(cudaMemsetAsync(s.k_cache.get(), 0, kv_bytes, s.stream));
  TS_CUDA(cudaMemsetAsync(s.v_cache.get(), 0, kv_bytes, s.stream));
  s.x = dev_alloc(B * d * 4, "activations x");
  s.xn = dev_alloc(B * d * 4, "activations xn");
  s.tmp = dev_alloc(B * d * 4, "activations tmp");
  s.q = dev_alloc(B * q_dim * 4, "q");
  s.k = dev_alloc(B * kv_dim * 4, "k");
  s.v = dev_alloc(B * kv_dim * 4, "v");
  s.att = dev_alloc(B * q_dim * 4, "attention output");
  s.gate = dev_alloc(B * size_t(c.n_ff) * 4, "ffn gate");
  s.up = dev_alloc(B * size_t(c.n_ff) * 4, "ffn up");
  s.logits = dev_alloc(B * V * 4, fmt::format("logits ({} x {})", B, V));
  const size_t splits = size_t(std::max(kDecodeSplits, kPrefillSplits));
  s.partial = dev_alloc(B * size_t(c.n_head) * splits * (hd + 2) * 4, "attention split-K partials");
  if (s.quantized) {
    s.deq =
        dev_alloc(size_t(s.w->max_matrix_elems) * 4, "dequantized-matrix scratch (prefill GEMM)");
  }
  if (s.split > 1) {
    const size_t widest = std::max({V, size_t(c.n_ff), q_dim, d});
    s.split_part = dev_alloc(B * widest * 4, "split-K fault partial products");
  }
  s.taps = dev_alloc(size_t(c.n_layer) * TS_TAP_POINTS * d * 4, "layer taps");
  s.params = dev_alloc((B + 2) * sizeof(int32_t), "token/position parameters");
  s.argmax = dev_alloc(sizeof(int32_t), "argmax");
  s.h_params = host_alloc((B + 2) * sizeof(int32_t), "token/position staging");
  s.h_logits = host_alloc(V * sizeof(float), "logits staging");
  s.h_argmax = host_alloc(sizeof(int32_t), "argmax staging");
}

// RoPE tables, one per distinct (base, linear scale) of the layers (the
// rope_base_off_1pct fault scales every base): the reference's fp64 angles
// (cuda_math::rope_theta with rope_freqs factors), [pos][i < n_rot/2][cos, sin].
void upload_rope_tables(CudaSession& s, const CudaModel& m) {
  const touchstone::ModelConfig& c = m.cfg;
  const size_t half = size_t(c.n_rot / 2);
  std::vector<std::pair<double, double>> keys;
  for (const touchstone::LayerConfig& lc : c.layers) {
    const std::pair<double, double> key{lc.rope_base * s.faults.rope_base_scale, lc.rope_scale};
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      std::vector<double> cs(size_t(s.max_ctx) * half * 2);
      for (int p = 0; p < s.max_ctx; ++p) {
        for (size_t i = 0; i < half; ++i) {
          const double ff = m.rope_freqs.empty() ? 1.0 : double{m.rope_freqs[i]};
          const double theta = cm::rope_theta(p, int64_t(i), c.n_rot, key.first, key.second, ff);
          cs[(size_t(p) * half + i) * 2] = std::cos(theta);
          cs[(size_t(p) * half + i) * 2 + 1] = std::sin(theta);
        }
      }
      s.rope_tables.push_back(
          dev_alloc(std::max<size_t>(cs.size(), 1) * sizeof(double), "RoPE cos/sin table"));
      TS_CUDA(cudaMemcpyAsync(s.rope_tables.back().get(), cs.data(), cs.size() * sizeof(double),
                              cudaMemcpyHostToDevice, s.stream));
      TS_CUDA(cudaStreamSynchronize(s.stream));
      it = keys.end() - 1;
    }
    s.layer_rope.push_back(as<double>(s.rope_tables[size_t(it - keys.begin())]));
  }
}

// The session's fault (touchstone/faults.h): parsed, refused when it is a serving
// fault (no step_batch / fork_session here), the split-K slice count set.
void set_fault(CudaSession& s, const char* name, int32_t n_threads) {
  try {
    s.faults = touchstone::parse_fault(name ? name : "");
  } catch (const touchstone::Error& e) {
    throw StatusError(TS_ERR_UNSUPPORTED, e.what());
  }
  if (s.faults.serving()) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      fmt::format("cuda does not implement fault '{}' (a serving fault: the "
                                  "backend has no step_batch / fork_session)",
                                  s.faults.name));
  }
  // thread_order_reduction: one slice per requested thread (the GPU has no host
  // threads; the count changes the rounding as a per-thread split would).
  if (s.faults.thread_order_reduction) s.split = std::max(1, int(n_threads));
  if (s.faults.session_order_reduction) {
    // The split changes with every session this process opens (a stand-in for
    // a scheduling-dependent reduction order).
    static std::atomic<int> sessions{0};
    s.faults.session_slices = 2 + sessions.fetch_add(1) % 16;
    s.split = s.faults.session_slices;
  }
}

struct Cuda {
  static constexpr const char* name = "cuda";
  static constexpr const char* version = "0.2.0";
  // ABI v3: every family of touchstone::ModelConfig on full_precision (the
  // quantized path reads the GGUF types listed in capabilities()), with the
  // canonical feature names of docs/model-families.md. ABI v4: layer taps.
  static constexpr const char* architectures = "llama,qwen2,qwen3,gemma3,phi3";
  static constexpr const char* model_features =
      "neox_rope,partial_rotary,key_length_head_dim,rope_freqs,linear_rope_scaling,"
      "sliding_window,per_layer_rope_base,qkv_bias,qk_norm,post_norms,fused_qkv,fused_gate_up,"
      "geglu,embedding_scale,attention_scale,final_logit_softcap";

  using Model = CudaModel;

  struct Session {
    std::unique_ptr<CudaSession> s;
    std::vector<float> h_taps;  // read_taps staging
    int32_t position() const { return s->pos; }
    int32_t max_context() const { return s->max_ctx; }
    void prefill(std::span<const int32_t> t, bool all, float* logits) {
      TS_CUDA(cudaSetDevice(s->model->device));
      run_prefill(*s, t.data(), int(t.size()), all, logits);
    }
    void decode(int32_t token, float* logits) {
      TS_CUDA(cudaSetDevice(s->model->device));
      run_decode(*s, token, logits);
    }
    int32_t prefill_greedy(std::span<const int32_t> t) {
      TS_CUDA(cudaSetDevice(s->model->device));
      return run_greedy(*s, t.data(), int(t.size()));
    }
    // Entries >= position are overwritten before they are read again (the
    // rewind_noop fault keeps the high-water mark, so stale entries are read).
    void rewind(int32_t position) {
      s->pos = position;
      if (!s->faults.rewind_noop) s->kv_len = position;
    }
    // ABI v4 layer taps: the last position of every call, recorded on the
    // device (plain launches while on, never the decode graph).
    void set_taps(bool on) {
      s->taps_on = on;
      s->taps_recorded = false;
    }
    void read_taps(float* out, int64_t n) {
      TS_CUDA(cudaSetDevice(s->model->device));
      const touchstone::ModelConfig& c = s->model->cfg;
      h_taps.clear();
      if (s->taps_on && s->taps_recorded) {
        h_taps.resize(size_t(c.n_layer) * TS_TAP_POINTS * size_t(c.n_embd));
        TS_CUDA(cudaStreamSynchronize(s->stream));
        TS_CUDA(cudaMemcpy(h_taps.data(), s->taps.get(), h_taps.size() * sizeof(float),
                           cudaMemcpyDeviceToHost));
      }
      touchstone::abi::copy_taps(h_taps.data(), h_taps.size(), out, n);
    }
  };

  static std::string device_name() { return describe_device(); }

  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_ALL_POSITION_LOGITS;
    // Types the quantized path reads on the device (full_precision dequantizes
    // every type touchstone::gguf knows on the host).
    c.weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                     TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(6) | TS_WEIGHT_TYPE_BIT(8) |
                     TS_WEIGHT_TYPE_BIT(12) | TS_WEIGHT_TYPE_BIT(14);
    c.max_context = 0;
    c.determinism_note =
        "not claimed: no atomics and fixed launch shapes, so runs repeat on one GPU with one "
        "cuBLAS version, but cuBLAS may pick other SGEMM algorithms on other GPUs/versions; "
        "prefill (cuBLAS) and decode (warp matvec) round differently";
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    const int dev = require_device();
    auto m = touchstone::abi::load_or_status([&] {
      gguf::File file = gguf::File::open(path);
      touchstone::ModelConfig cfg = touchstone::read_model_config(file);
      return std::make_unique<CudaModel>(std::move(file), std::move(cfg), dev);
    });
    if (!tc::attention_head_dim_supported(m->cfg.head_dim)) {
      throw StatusError(
          TS_ERR_UNSUPPORTED,
          fmt::format("cuda backend: head_dim {} not supported (16, 32, 64, 128, 256)",
                      m->cfg.head_dim));
    }
    return m;
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    require_device();
    TS_CUDA(cudaSetDevice(m.device));
    auto s = std::make_unique<CudaSession>();
    s->model = &m;
    set_fault(*s, o.fault, o.n_threads);
    s->quantized = o.weight_path == TS_WEIGHTS_QUANTIZED;
    if (s->faults.quantized_only() && s->quantized) {
      // The corrupted blocks are this session's own copy; full_precision
      // computes with fp32 weights, which these faults do not reach.
      s->own_w = load_weights(m, true, &s->faults);
      s->w = s->own_w.get();
    } else {
      s->w = &model_weights(m, o.weight_path);
    }
    s->max_ctx = o.max_context > 0 ? o.max_context : m.cfg.n_ctx_train;
    s->use_graph = env_flag("TOUCHSTONE_CUDA_GRAPH", true);
    s->check_argmax = env_flag("TOUCHSTONE_CUDA_CHECK_ARGMAX", false);
    TS_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    TS_CUBLAS(cublasCreate(&s->blas));
    TS_CUBLAS(cublasSetStream(s->blas, s->stream));
    TS_CUBLAS(cublasSetMathMode(s->blas, CUBLAS_PEDANTIC_MATH));  // fp32 compute, never TF32
    allocate_buffers(*s, m.cfg);
    upload_rope_tables(*s, m);
    auto session = std::make_unique<Session>();
    session->s = std::move(s);
    return session;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Cuda)
