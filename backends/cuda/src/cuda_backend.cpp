// cuda_backend.cpp - the CUDA backend behind the session contract
// (touchstone/backend_abi.h) through touchstone::BackendAdapter, which applies
// the shared argument checks. Built as libtouchstone_backend_cuda.so.
//
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
#include "touchstone/gguf.h"
#include "touchstone/llama_config.h"
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

struct DevLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
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

class WeightLoader {
 public:
  WeightLoader(const gguf::File& f, bool quantized, DevWeights& w)
      : f_(f), quantized_(quantized), w_(w) {}

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
              "Q8_0, Q4_K, Q6_K (use --weights full_precision)",
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
    m.ptr = upload(bytes.data(), bytes.size(), name);
    return m;
  }

 private:
  const gguf::File& f_;
  bool quantized_;
  DevWeights& w_;
};

}  // namespace

struct CudaModel {
  CudaModel(gguf::File f, touchstone::ModelConfig c, int dev)
      : file(std::move(f)), cfg(std::move(c)), device(dev) {}
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;
  ~CudaModel() { cudaSetDevice(device); }  // the weights are freed on their device
  int32_t n_vocab() const { return cfg.n_vocab; }
  gguf::File file;
  touchstone::ModelConfig cfg;
  int device = 0;
  std::array<std::unique_ptr<DevWeights>, 2> weights;  // by ts_weight_path
};

namespace {

const DevWeights& model_weights(CudaModel& m, ts_weight_path path) {
  auto& slot = m.weights[path == TS_WEIGHTS_QUANTIZED ? 1 : 0];
  if (slot) return *slot;
  const touchstone::ModelConfig& c = m.cfg;
  auto w = std::make_unique<DevWeights>();
  WeightLoader ld(m.file, path == TS_WEIGHTS_QUANTIZED, *w);
  const int d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  w->tok_embd = ld.mat("token_embd.weight", c.n_vocab, d);
  w->out_norm = ld.vec("output_norm.weight", d);
  w->lm_head = c.tied_embeddings ? w->tok_embd : ld.mat("output.weight", c.n_vocab, d);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    DevLayer L;
    L.attn_norm = ld.vec(p + "attn_norm.weight", d);
    L.wq = ld.mat(p + "attn_q.weight", q_dim, d);
    L.wk = ld.mat(p + "attn_k.weight", kv_dim, d);
    L.wv = ld.mat(p + "attn_v.weight", kv_dim, d);
    L.wo = ld.mat(p + "attn_output.weight", d, q_dim);
    L.ffn_norm = ld.vec(p + "ffn_norm.weight", d);
    L.gate = ld.mat(p + "ffn_gate.weight", c.n_ff, d);
    L.up = ld.mat(p + "ffn_up.weight", c.n_ff, d);
    L.down = ld.mat(p + "ffn_down.weight", d, c.n_ff);
    w->layers.push_back(L);
  }
  slot = std::move(w);
  return *slot;
}

}  // namespace

struct CudaSession {
  CudaModel* model = nullptr;
  const DevWeights* w = nullptr;
  bool quantized = false;
  int max_ctx = 0;
  int pos = 0;
  bool use_graph = true;
  bool check_argmax = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cudaGraphExec_t graph = nullptr;
  // Device buffers (allocated once at open_session).
  DevPtr k_cache, v_cache, rope_cs, x, xn, q, k, v, att, gate, up, tmp, logits, partial, deq,
      params, argmax;
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

// out[n][n_out] = M . in[n][n_in]  (row-major activations).
void linear(CudaSession& s, const DevMatrix& M, const float* in, float* out, int n) {
  if (n == 1) {
    check_launch(tc::launch_matvec(M.type, M.ptr, in, out, M.n_out, M.n_in, s.stream),
                 "matvec kernel launch");
    return;
  }
  const float* A = static_cast<const float*>(M.ptr);
  if (M.type != WType::F32) {
    check_launch(tc::launch_dequantize(M.type, M.ptr, as<float>(s.deq), M.n_out, M.n_in, s.stream),
                 "dequantize kernel launch");
    A = as<float>(s.deq);
  }
  // Row-major W [n_out][n_in] is column-major W^T (lda = n_in); activations are
  // column-major [n_in][n]; out column-major [n_out][n] = row-major [n][n_out].
  const float one = 1.0f, zero = 0.0f;
  TS_CUBLAS(cublasSgemm(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, M.n_out, n, M.n_in, &one, A, M.n_in, in,
                        M.n_in, &zero, out, M.n_out));
}

enum class Logits { None, Last, All };

// Enqueues one forward pass of n tokens (ids and start position already in
// s.params on the device). Logits go to s.logits.
void enqueue_forward(CudaSession& s, int n, Logits mode) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevWeights& w = *s.w;
  const int d = c.n_embd, hd = c.head_dim, kv_dim = c.n_head_kv * hd;
  const double eps = c.rms_norm_eps;
  const int32_t* d_pos = as<int32_t>(s.params);
  const int32_t* d_tokens = d_pos + 1;
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  const size_t layer_kv = size_t(s.max_ctx) * size_t(kv_dim);
  const int n_split = n == 1 ? kDecodeSplits : kPrefillSplits;

  check_launch(tc::launch_get_rows(w.tok_embd.type, w.tok_embd.ptr, d_tokens, n, d, x, s.stream),
               "get_rows");
  for (int l = 0; l < c.n_layer; ++l) {
    const DevLayer& L = w.layers[size_t(l)];
    float* kc = as<float>(s.k_cache) + size_t(l) * layer_kv;
    float* vc = as<float>(s.v_cache) + size_t(l) * layer_kv;
    check_launch(
        tc::launch_add_rmsnorm(x, l == 0 ? nullptr : tmp, L.attn_norm, xn, n, d, eps, s.stream),
        "add_rmsnorm");
    linear(s, L.wq, xn, as<float>(s.q), n);
    linear(s, L.wk, xn, as<float>(s.k), n);
    linear(s, L.wv, xn, as<float>(s.v), n);
    check_launch(
        tc::launch_rope_store(as<float>(s.q), as<float>(s.k), as<float>(s.v), kc, vc,
                              as<double>(s.rope_cs), d_pos, n, c.n_head, c.n_head_kv, hd, s.stream),
        "rope_store");
    check_launch(
        tc::launch_attention(as<float>(s.q), kc, vc, as<float>(s.partial), as<float>(s.att), d_pos,
                             n, c.n_head, c.n_head_kv, hd, n_split, s.stream),
        "attention");
    linear(s, L.wo, as<float>(s.att), tmp, n);
    check_launch(tc::launch_add_rmsnorm(x, tmp, L.ffn_norm, xn, n, d, eps, s.stream),
                 "add_rmsnorm");
    linear(s, L.gate, xn, as<float>(s.gate), n);
    linear(s, L.up, xn, as<float>(s.up), n);
    check_launch(
        tc::launch_swiglu(as<float>(s.gate), as<float>(s.up), int64_t{n} * c.n_ff, s.stream),
        "swiglu");
    linear(s, L.down, as<float>(s.gate), tmp, n);
  }
  check_launch(tc::launch_add_rmsnorm(x, tmp, w.out_norm, xn, n, d, eps, s.stream), "add_rmsnorm");
  if (mode == Logits::All) {
    linear(s, w.lm_head, xn, as<float>(s.logits), n);
  } else if (mode == Logits::Last) {
    linear(s, w.lm_head, xn + size_t(n - 1) * size_t(d), as<float>(s.logits), 1);
  }
}

void stage_params(CudaSession& s, const int32_t* tokens, int n) {
  auto* hp = static_cast<int32_t*>(s.h_params.get());
  hp[0] = s.pos;
  std::memcpy(hp + 1, tokens, size_t(n) * sizeof(int32_t));
  TS_CUDA(cudaMemcpyAsync(s.params.get(), hp, size_t(n + 1) * sizeof(int32_t),
                          cudaMemcpyHostToDevice, s.stream));
}

void verify_argmax(CudaSession& s, const float* logits) {
  if (!s.check_argmax) return;
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

// Decode one token: graph launch (captured on first use) or plain launches.
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
  if (s.use_graph) {
    if (!s.graph) {
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
    TS_CUDA(cudaGraphLaunch(s.graph, s.stream));
  } else {
    enqueue_forward(s, 1, Logits::Last);
    enqueue_tail();
  }
  TS_CUDA(cudaStreamSynchronize(s.stream));
  std::memcpy(logits_out, s.h_logits.get(), size_t(V) * sizeof(float));
  verify_argmax(s, logits_out);
  ++s.pos;
}

void run_prefill(CudaSession& s, const int32_t* tokens, int n, bool all_positions,
                 float* logits_out) {
  const size_t V = size_t(s.model->cfg.n_vocab);
  for (int off = 0; off < n; off += kMaxBatch) {
    const int cnt = std::min(kMaxBatch, n - off);
    const bool last = off + cnt == n;
    stage_params(s, tokens + off, cnt);
    const Logits mode = all_positions ? Logits::All : (last ? Logits::Last : Logits::None);
    enqueue_forward(s, cnt, mode);
    if (mode == Logits::All) {
      TS_CUDA(cudaMemcpyAsync(logits_out + size_t(off) * V, s.logits.get(),
                              size_t(cnt) * V * sizeof(float), cudaMemcpyDeviceToHost, s.stream));
    } else if (mode == Logits::Last) {
      TS_CUDA(cudaMemcpyAsync(s.h_logits.get(), s.logits.get(), V * sizeof(float),
                              cudaMemcpyDeviceToHost, s.stream));
    }
    TS_CUDA(cudaStreamSynchronize(s.stream));
    if (mode == Logits::Last) std::memcpy(logits_out, s.h_logits.get(), V * sizeof(float));
    s.pos += cnt;
  }
}

// prefill_greedy: the forward pass as run_prefill (last position's logits stay
// on the device), the argmax kernel (lowest id on ties, NaN never wins), and a
// 4-byte copy back. Not captured as a graph.
int32_t run_greedy(CudaSession& s, const int32_t* tokens, int n) {
  const int V = s.model->cfg.n_vocab;
  for (int off = 0; off < n; off += kMaxBatch) {
    const int cnt = std::min(kMaxBatch, n - off);
    const bool last = off + cnt == n;
    stage_params(s, tokens + off, cnt);
    enqueue_forward(s, cnt, last ? Logits::Last : Logits::None);
    if (last) {
      check_launch(tc::launch_argmax(as<float>(s.logits), V, as<int32_t>(s.argmax), s.stream),
                   "argmax");
      TS_CUDA(cudaMemcpyAsync(s.h_argmax.get(), s.argmax.get(), sizeof(int32_t),
                              cudaMemcpyDeviceToHost, s.stream));
    }
    TS_CUDA(cudaStreamSynchronize(s.stream));
    s.pos += cnt;
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
  s.params = dev_alloc((B + 1) * sizeof(int32_t), "token/position parameters");
  s.argmax = dev_alloc(sizeof(int32_t), "argmax");
  s.h_params = host_alloc((B + 1) * sizeof(int32_t), "token/position staging");
  s.h_logits = host_alloc(V * sizeof(float), "logits staging");
  s.h_argmax = host_alloc(sizeof(int32_t), "argmax staging");
}

// RoPE table: the reference's fp64 angles, [pos][i][cos, sin].
void upload_rope_table(CudaSession& s, const touchstone::ModelConfig& c) {
  const size_t hd = size_t(c.head_dim), half = hd / 2;
  std::vector<double> cs(size_t(s.max_ctx) * half * 2);
  const double base = double{c.rope_freq_base};
  for (int p = 0; p < s.max_ctx; ++p) {
    for (size_t i = 0; i < half; ++i) {
      const double theta = cm::rope_theta(p, int64_t(i), int64_t(hd), base);
      cs[(size_t(p) * half + i) * 2] = std::cos(theta);
      cs[(size_t(p) * half + i) * 2 + 1] = std::sin(theta);
    }
  }
  s.rope_cs = dev_alloc(cs.size() * sizeof(double), "RoPE cos/sin table");
  TS_CUDA(cudaMemcpyAsync(s.rope_cs.get(), cs.data(), cs.size() * sizeof(double),
                          cudaMemcpyHostToDevice, s.stream));
  TS_CUDA(cudaStreamSynchronize(s.stream));
}

struct Cuda {
  static constexpr const char* name = "cuda";
  static constexpr const char* version = "0.1.0";
  // ABI v3: the plain Llama family only (docs/model-families.md). No layer taps (ABI v4).
  static constexpr const char* architectures = "llama";
  static constexpr const char* model_features = "";

  using Model = CudaModel;

  struct Session {
    std::unique_ptr<CudaSession> s;
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
    // Entries >= position are overwritten before they are read again.
    void rewind(int32_t position) { s->pos = position; }
  };

  static std::string device_name() { return describe_device(); }

  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_ALL_POSITION_LOGITS;
    // Types the quantized path reads on the device (full_precision dequantizes
    // every type touchstone::gguf knows on the host).
    c.weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                     TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(8) | TS_WEIGHT_TYPE_BIT(12) |
                     TS_WEIGHT_TYPE_BIT(14);
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
      touchstone::ModelConfig cfg = touchstone::read_llama_config(file);
      return std::make_unique<CudaModel>(std::move(file), std::move(cfg), dev);
    });
    if (!tc::attention_head_dim_supported(m->cfg.head_dim)) {
      throw StatusError(
          TS_ERR_UNSUPPORTED,
          fmt::format("cuda backend: head_dim {} not supported (64 or 128)", m->cfg.head_dim));
    }
    return m;
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    if (o.fault && *o.fault) {
      throw StatusError(
          TS_ERR_UNSUPPORTED,
          fmt::format("unknown fault '{}' (the cuda backend implements no fault injection)",
                      o.fault));
    }
    require_device();
    TS_CUDA(cudaSetDevice(m.device));
    auto s = std::make_unique<CudaSession>();
    s->model = &m;
    s->quantized = o.weight_path == TS_WEIGHTS_QUANTIZED;
    s->w = &model_weights(m, o.weight_path);
    s->max_ctx = o.max_context > 0 ? o.max_context : m.cfg.n_ctx_train;
    s->use_graph = env_flag("TOUCHSTONE_CUDA_GRAPH", true);
    s->check_argmax = env_flag("TOUCHSTONE_CUDA_CHECK_ARGMAX", false);
    TS_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    TS_CUBLAS(cublasCreate(&s->blas));
    TS_CUBLAS(cublasSetStream(s->blas, s->stream));
    TS_CUBLAS(cublasSetMathMode(s->blas, CUBLAS_PEDANTIC_MATH));  // fp32 compute, never TF32
    allocate_buffers(*s, m.cfg);
    upload_rope_table(*s, m.cfg);
    auto session = std::make_unique<Session>();
    session->s = std::move(s);
    return session;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Cuda)
