// cuda_backend.cpp - the CUDA backend behind the session contract
// (touchstone/abi/backend_abi.h) through touchstone::BackendAdapter, which applies
// the shared argument checks. Built as libtouchstone_backend_cuda.so with
// cuda_forward.cpp (the forward pass), cuda_run.cpp (one session's calls),
// cuda_batch.cpp (ABI v6 step_batch and fork_session) and kernels.cu; this
// file: errors, device memory, weights, sessions and the backend class.
//
//  * One forward pass for every family: it reads touchstone::ModelConfig
//    (read_model_config, as reference_forward.cpp and cpu_simd) and switches
//    the features on from it (NeoX / partial RoPE, rope_freqs, linear scaling,
//    per-layer RoPE base and sliding window, Q/K/V biases, QK-norm, post-norms,
//    GeGLU, embedding / attention scale, logit soft-capping; fused QKV and
//    gate|up matrices are split at load as row ranges of one upload).
//  * The fault catalog (touchstone/model/faults.h) but two serving faults
//    (batch_token_count_split, batch_kv_leak: refused), and the ABI v4 layer
//    taps (recorded on the device with plain launches).
//  * ABI v6: step_batch runs the entries' tokens in passes of up to kMaxBatch
//    rows (one set of matrix products per pass, attention per sequence against
//    its own KV cache); fork_session copies the KV prefix on the device.
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
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_session.h"
#include "kernels.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/common/error.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/session_fault.h"

namespace touchstone::cuda {
namespace {

using touchstone::abi::StatusError;

// ---- errors ----------------------------------------------------------------------
std::string current_device() {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) return "device ?";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return fmt::format("device {}", dev);
  return fmt::format("device {} ({})", dev, p.name);
}

// The device index asked for: TOUCHSTONE_CUDA_DEVICE; else the GPU CTest gave
// the running test (RESOURCE_GROUPS "gpus:1" with a resource spec file whose
// GPU ids are CUDA device indices: CTEST_RESOURCE_GROUP_0_GPUS="id:N,slots:1",
// docs/fleet.md#gpus); else 0.
int selected_device() {
  if (const char* s = std::getenv("TOUCHSTONE_CUDA_DEVICE"); s && *s) return std::atoi(s);
  if (const char* s = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS");
      s && std::strncmp(s, "id:", 3) == 0)
    return std::atoi(s + 3);
  return 0;
}

// Selected device (selected_device()); TS_ERR_DEVICE when none.
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
  const int dev = selected_device();
  if (dev < 0 || dev >= n) {
    throw StatusError(TS_ERR_DEVICE,
                      fmt::format("device {} asked for (TOUCHSTONE_CUDA_DEVICE or CTest's "
                                  "resource group) but cudaGetDeviceCount found {} device(s)",
                                  dev, n));
  }
  TS_CUDA(cudaSetDevice(dev));
  return dev;
}

bool env_flag(const char* name, bool dflt) {
  const char* s = std::getenv(name);
  if (!s || !*s) return dflt;
  return std::string(s) != "0";
}

// Rows [begin, begin + n) of m (a fused matrix split at load: same storage).
DevMatrix sub_rows(const DevMatrix& m, int begin, int n) {
  DevMatrix r = m;
  r.n_out = n;
  r.ptr = static_cast<const uint8_t*>(m.ptr) + cm::row_bytes(m.type, m.n_in) * begin;
  return r;
}

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

CudaModel::CudaModel(gguf::File f, touchstone::ModelConfig c, int dev)
    : file(std::move(f)), cfg(std::move(c)), device(dev) {
  if (cfg.rope_freq_factors) {  // rope_freqs.weight: n_rot / 2 divisors (llama3 scaling)
    const gguf::TensorInfo& t = file.tensor("rope_freqs.weight");
    rope_freqs = gguf::dequantize(file, t);
    if (rope_freqs.size() != size_t(cfg.n_rot / 2)) {
      throw StatusError(TS_ERR_IO, fmt::format("{}: rope_freqs.weight holds {} values, expected {}",
                                               file.path(), rope_freqs.size(), cfg.n_rot / 2));
    }
  }
}

namespace {

// One layer's tensors, named and shaped as model/core/src/model_weights.cpp
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

// ---- the backend's device, sessions ----------------------------------------------------
std::string describe_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return e != cudaSuccess
               ? fmt::format("CUDA: no device (cudaGetDeviceCount: {})", cudaGetErrorString(e))
               : std::string("CUDA: no device (cudaGetDeviceCount found 0 devices)");
  }
  const int dev = selected_device();
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
  // A step_batch pass led by this session: a [position, KV floor] record per
  // segment (at most B segments of >= 1 row) and B token ids.
  s.bparams = dev_alloc(3 * B * sizeof(int32_t), "step_batch segment parameters");
  s.h_bparams = host_alloc(3 * B * sizeof(int32_t), "step_batch parameter staging");
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

// The session's fault (touchstone/model/faults.h): parsed, refused when it is one of
// a serving fault not implemented here, the split-K slice count set.
void set_fault(CudaSession& s, const char* name, int32_t n_threads) {
  s.faults = touchstone::abi::session_fault(name);
  // batch_token_count_split would need a split-K set per step_batch call,
  // batch_kv_leak an attention launch that reads a second sequence's KV cache.
  if (s.faults.batch_token_count_split || s.faults.batch_kv_leak || s.faults.fork_shared_kv ||
      s.faults.batch_all_positions_shift || s.faults.batch_page_boundary_leak) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      fmt::format("cuda does not implement fault '{}' (a serving fault; of those "
                                  "cuda implements fork_short_copy, batch_position_offset and "
                                  "verify_row_shift)",
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

}  // namespace

std::unique_ptr<CudaSession> new_session(CudaModel& m, const CudaSessionOptions& o) {
  require_device();
  TS_CUDA(cudaSetDevice(m.device));
  auto s = std::make_unique<CudaSession>();
  s->model = &m;
  s->opts = o;
  set_fault(*s, o.fault.c_str(), o.n_threads);
  s->quantized = o.weight_path == TS_WEIGHTS_QUANTIZED;
  if (s->faults.quantized_only() && s->quantized) {
    // The corrupted blocks are this session's own copy (a fork uploads its
    // own); full_precision computes with fp32 weights, which these faults do not reach.
    s->own_w = load_weights(m, true, &s->faults);
    s->w = s->own_w.get();
  } else {
    s->w = &model_weights(m, o.weight_path);
  }
  s->max_ctx = o.max_ctx;
  s->use_graph = env_flag("TOUCHSTONE_CUDA_GRAPH", true);
  s->check_argmax = env_flag("TOUCHSTONE_CUDA_CHECK_ARGMAX", false);
  TS_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  TS_CUBLAS(cublasCreate(&s->blas));
  TS_CUBLAS(cublasSetStream(s->blas, s->stream));
  TS_CUBLAS(cublasSetMathMode(s->blas, CUBLAS_PEDANTIC_MATH));  // fp32 compute, never TF32
  allocate_buffers(*s, m.cfg);
  upload_rope_tables(*s, m);
  return s;
}

}  // namespace touchstone::cuda

// ---- the session contract, through touchstone::BackendAdapter ------------------------------
namespace {

namespace tc = touchstone::cuda;
using touchstone::abi::StatusError;

struct Cuda {
  static constexpr const char* name = "cuda";
  static constexpr const char* version = "0.2.0";
  // ABI v3: every family of touchstone::ModelConfig on full_precision (the
  // quantized path reads the GGUF types listed in capabilities()), with the
  // canonical feature names of docs/model-families.md. ABI v4: layer taps.
  // ABI v6: step_batch and fork_session (cuda_batch.cpp).
  static constexpr const char* architectures = "llama,qwen2,qwen3,gemma3,phi3";
  static constexpr const char* model_features =
      "neox_rope,partial_rotary,key_length_head_dim,rope_freqs,linear_rope_scaling,"
      "sliding_window,per_layer_rope_base,qkv_bias,qk_norm,post_norms,fused_qkv,fused_gate_up,"
      "geglu,embedding_scale,attention_scale,final_logit_softcap";

  using Model = tc::CudaModel;

  struct Session {
    std::unique_ptr<tc::CudaSession> s;
    std::vector<float> h_taps;  // read_taps staging
    int32_t position() const { return s->pos; }
    int32_t max_context() const { return s->max_ctx; }
    void prefill(std::span<const int32_t> t, bool all, float* logits) {
      TS_CUDA(cudaSetDevice(s->model->device));
      tc::run_prefill(*s, t.data(), int(t.size()), all, logits);
    }
    void decode(int32_t token, float* logits) {
      TS_CUDA(cudaSetDevice(s->model->device));
      tc::run_decode(*s, token, logits);
    }
    int32_t prefill_greedy(std::span<const int32_t> t) {
      TS_CUDA(cudaSetDevice(s->model->device));
      return tc::run_greedy(*s, t.data(), int(t.size()));
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
    // ABI v6 fork_session: a session with this one's options, the KV prefix
    // copied on the device (cuda_batch.cpp).
    std::unique_ptr<Session> fork(int32_t n_prefix) {
      auto f = std::make_unique<Session>();
      f->s = tc::fork_session(*s, n_prefix);
      return f;
    }
  };

  // ABI v6 step_batch: passes of up to kMaxBatch rows over every entry's tokens
  // (cuda_batch.cpp); the adapter has checked the entries.
  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    std::vector<tc::BatchEntry> e;
    e.reserve(items.size());
    for (const auto& it : items) {
      e.push_back({it.session->s.get(), it.tokens.data(), int(it.tokens.size()), it.all_positions,
                   it.logits});
    }
    tc::step_batch(e);
  }

  static std::string device_name() { return tc::describe_device(); }

  static void capabilities(ts_capabilities& c) {
    // ABI v6: step_batch is one forward pass per up to kMaxBatch rows, fork
    // copies the KV prefix. Not TS_CAP_BATCH_INVARIANT: a row's matrix products
    // are cuBLAS SGEMMs whose reduction order may change with the pass's row
    // count (and one row takes the warp matvec kernel).
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY;
    c.max_batch = 0;  // any number of entries (passes of up to kMaxBatch rows)
    // Types the quantized path reads on the device (full_precision dequantizes
    // every type touchstone::gguf knows on the host).
    c.weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                     TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(6) | TS_WEIGHT_TYPE_BIT(8) |
                     TS_WEIGHT_TYPE_BIT(12) | TS_WEIGHT_TYPE_BIT(14);
    c.max_context = 0;
    c.determinism_note =
        "not claimed: no atomics and fixed launch shapes, so runs repeat on one GPU with one "
        "cuBLAS version, but cuBLAS may pick other SGEMM algorithms on other GPUs/versions; "
        "prefill (cuBLAS) and decode (warp matvec) round differently, and a step_batch row "
        "rounds as its pass's row count makes cuBLAS reduce";
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    const int dev = tc::require_device();
    auto m = touchstone::abi::load_or_status([&] {
      touchstone::gguf::File file = touchstone::gguf::File::open(path);
      touchstone::ModelConfig cfg = touchstone::read_model_config(file);
      // Refused by name before any upload (a mixture-of-experts model, for one: the
      // kernels have no router or expert FFN), as cpu_simd's check_supported.
      const std::string missing =
          touchstone::unsupported_features(cfg, architectures, model_features);
      if (!missing.empty())
        throw touchstone::UnsupportedModel("{}: not supported by cuda: {}", path, missing);
      return std::make_unique<tc::CudaModel>(std::move(file), std::move(cfg), dev);
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
    tc::CudaSessionOptions opts;
    opts.weight_path = o.weight_path;
    opts.max_ctx = o.max_context > 0 ? o.max_context : m.cfg.n_ctx_train;
    opts.fault = o.fault ? o.fault : "";
    opts.n_threads = o.n_threads;
    auto session = std::make_unique<Session>();
    session->s = tc::new_session(m, opts);
    return session;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Cuda)
