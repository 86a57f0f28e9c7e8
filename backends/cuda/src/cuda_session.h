// cuda_session.h - what the CUDA backend's sources share (g++ only): the CUDA
// error and device-memory helpers, the weights on the device, the model and
// the session, and the entry points of
//   cuda_forward.cpp  the forward pass of a Pass (segments of one or more sessions),
//   cuda_run.cpp      one session's prefill, decode (CUDA graph) and greedy calls,
//   cuda_batch.cpp    ABI v6 serving: step_batch and fork_session,
//   cuda_backend.cpp  weights, sessions and the backend class.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"

namespace touchstone::cuda {

namespace cm = touchstone::cuda_math;

inline constexpr int kMaxBatch = 256;     // rows of a forward pass (prefill chunk, step_batch pass)
inline constexpr int kDecodeSplits = 16;  // split-K partitions of the KV cache for one token
inline constexpr int kPrefillSplits = 4;

// ---- errors (cuda_backend.cpp): StatusError naming the device, the call and the error ----
[[noreturn]] void cuda_fail(cudaError_t e, const char* call);
[[noreturn]] void cublas_fail(cublasStatus_t s, const char* call);

#define TS_CUDA(call)                                                      \
  do {                                                                     \
    const cudaError_t ts_e_ = (call);                                      \
    if (ts_e_ != cudaSuccess) ::touchstone::cuda::cuda_fail(ts_e_, #call); \
  } while (0)
#define TS_CUBLAS(call)                                                                \
  do {                                                                                 \
    const cublasStatus_t ts_s_ = (call);                                               \
    if (ts_s_ != CUBLAS_STATUS_SUCCESS) ::touchstone::cuda::cublas_fail(ts_s_, #call); \
  } while (0)

inline void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(e, what);
}

// ---- device memory ------------------------------------------------------------------
struct CudaFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
using DevPtr = std::unique_ptr<void, CudaFree>;
// TS_ERR_OUT_OF_MEMORY with the size, `what` and the device's free/total memory.
DevPtr dev_alloc(size_t bytes, const std::string& what);

struct HostFree {
  void operator()(void* p) const noexcept { cudaFreeHost(p); }
};
using HostPtr = std::unique_ptr<void, HostFree>;
HostPtr host_alloc(size_t bytes, const std::string& what);  // pinned

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

struct CudaModel {
  CudaModel(gguf::File f, touchstone::ModelConfig c, int dev);  // reads rope_freqs
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

// What a session was opened with (a fork opens its session with the same).
struct CudaSessionOptions {
  ts_weight_path weight_path = TS_WEIGHTS_FULL_PRECISION;
  int max_ctx = 0;  // KV cache rows (> 0: ts_session_options' 0 resolved to n_ctx_train)
  std::string fault;
  int32_t n_threads = 0;
};

struct CudaSession {
  CudaModel* model = nullptr;
  CudaSessionOptions opts;
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
  // Device buffers (allocated once at open_session). params: [position, KV floor,
  // tokens...] of this session's own calls; bparams: a step_batch pass led by
  // this session ([position, KV floor] of segment k at 2k, token ids from 2 * kMaxBatch).
  DevPtr k_cache, v_cache, x, xn, q, k, v, att, gate, up, tmp, logits, partial, deq, params, argmax,
      split_part, taps, bparams;
  std::vector<DevPtr> rope_tables;        // one per distinct (base, scale) of the layers
  std::vector<const double*> layer_rope;  // [n_layer]: the layer's table ([max_ctx] rows)
  // Pinned host staging.
  HostPtr h_params, h_logits, h_argmax, h_bparams;

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

// A new session of m (cuda_backend.cpp): fault parsed (the refused ones throw
// TS_ERR_UNSUPPORTED), weights (a quantized-only fault uploads its own
// corrupted copy), stream, cuBLAS handle, buffers, RoPE tables.
std::unique_ptr<CudaSession> new_session(CudaModel& m, const CudaSessionOptions& o);

// ---- the forward pass (cuda_forward.cpp) ---------------------------------------------------
enum class Logits { None, Last, All };

// One sequence's rows [row0, row0 + n) of a pass.
struct Segment {
  CudaSession* s = nullptr;           // whose KV cache, RoPE tables and layer taps
  int row0 = 0, n = 0;                // rows of the pass
  const int32_t* d_params = nullptr;  // device [position of row0, KV floor] (kernels.h)
  int rope_origin = 0;                // RoPE table row = position - rope_origin
  int out_rows = 0;                   // logits rows: 0, 1 (its last row) or n
  int out_row0 = 0;                   // their first row in the pass's logits
  bool tap = false;                   // record its last row's layer taps into s->taps
};

// n rows (<= kMaxBatch) computed with the lead session's weights, faults,
// buffers, cuBLAS handle and stream: everything over all rows at once but RoPE
// + KV store and attention, which run per segment against its own KV cache.
struct Pass {
  std::span<const Segment> segs;      // in row order, covering [0, n)
  int n = 0;                          // rows
  int out_rows = 0;                   // logits rows (the segments' out_rows, in order)
  const int32_t* d_tokens = nullptr;  // device token ids of the n rows
};

// Enqueues pass p on lead.stream; the logits rows go to lead.logits. Records
// the layer taps of the segments that ask for them.
void enqueue_pass(CudaSession& lead, const Pass& p);
// One session's n tokens (ids and start position already in s.params; rope_origin:
// the prefill_position_reset fault's origin, else 0), logits to s.logits.
void enqueue_forward(CudaSession& s, int n, Logits mode, int rope_origin = 0);

// ---- one session's calls (cuda_run.cpp) -------------------------------------------------
void advance(CudaSession& s, int n);  // after a pass of n tokens
// The logits_perturb_1e-3 fault on n_rows rows of positions first_pos, ... (host, fp64).
void perturb_logits(const CudaSession& s, float* rows, int n_rows, int first_pos);
// The logits_row_shift (any all-position call) and verify_row_shift (one that
// continues a sequence: start > 0) faults: row i holds row i-1.
void shift_rows(const CudaSession& s, int start, int n, bool all_positions, float* logits);
void run_decode(CudaSession& s, int32_t token, float* logits_out);
void run_prefill(CudaSession& s, const int32_t* tokens, int n, bool all_positions,
                 float* logits_out);
int32_t run_greedy(CudaSession& s, const int32_t* tokens, int n);

// ---- ABI v6 serving (cuda_batch.cpp) --------------------------------------------------------
// One entry of step_batch (checked by the adapter: distinct sessions of one
// model and weight path, room in each KV cache).
struct BatchEntry {
  CudaSession* s = nullptr;
  const int32_t* tokens = nullptr;
  int n = 0;
  bool all_positions = false;
  float* logits = nullptr;  // n_vocab floats, or n * n_vocab when all_positions
};
// Each entry appends its tokens as run_prefill would, in passes of up to
// kMaxBatch rows over all entries; entries that cannot share the lead's pass
// (another fault, weights or split-K) run one by one.
void step_batch(std::span<const BatchEntry> entries);
// A new session with src's options whose KV cache holds src's first n_prefix
// positions (copied on the device); 0 <= n_prefix <= src.pos (adapter-checked).
std::unique_ptr<CudaSession> fork_session(CudaSession& src, int n_prefix);

}  // namespace touchstone::cuda
