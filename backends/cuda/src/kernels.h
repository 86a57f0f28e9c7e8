// kernels.h - launchers of the CUDA backend's kernels (kernels.cu). Plain C++:
// included by cuda_backend.cpp (g++). Every launcher enqueues on `stream` and
// returns cudaGetLastError(); nothing here allocates or synchronizes, so every
// launcher can be captured into a CUDA graph.
//
// Device-side parameters `d_params` (int32): [0] the position of the first token
// of the batch, [1] the KV floor (the rewind_noop fault's high-water mark, else
// 0), [2..] the batch's token ids (one session's call; a step_batch pass stages
// one [position, KV floor] record per sequence and the token ids apart, and
// launches RoPE and attention per sequence on its rows). Kernels read them from
// device memory so that a captured decode graph stays valid for every position.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "touchstone/cuda/kernel_math.h"

namespace touchstone::cuda {

using cuda_math::WType;

// x[i][:] = row d_tokens[i] of the embedding matrix (type, n_embd wide) times
// scale (fp64, rounded once; cuda_math::embd_scaled), i < n_tokens.
cudaError_t launch_get_rows(WType type, const void* table, const int32_t* d_tokens, int n_tokens,
                            int n_embd, double scale, float* x, cudaStream_t stream);

// Per row r < n_rows: if delta, x[r] += delta[r] (fp64 add, rounded); then
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (fp64 accumulation). out may be x
// (in place: the per-head QK-norm, the post-norms).
cudaError_t launch_add_rmsnorm(float* x, const float* delta, const float* w, float* out, int n_rows,
                               int n, double eps, cudaStream_t stream);

// y[o] = W[o, :] . x for o < n_out (W: n_out rows of `type`, n_in wide); one warp
// per row, the order of cuda_math::row_dot_emulated.
cudaError_t launch_matvec(WType type, const void* W, const float* x, float* y, int n_out, int n_in,
                          cudaStream_t stream);

// out[r][c] = dequantized W[r][c] (fp32, row-major), all rows.
cudaError_t launch_dequantize(WType type, const void* W, float* out, int n_rows, int n_in,
                              cudaStream_t stream);

// RoPE of the batch's q (in place) and k, then K/V stored in the layer's cache.
struct RopeParams {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  int n_rot = 0;         // rotated dimensions of each head (partial rotary: < head_dim)
  bool neox = false;     // pairs (i, i + n_rot/2), else (2i, 2i+1) (cuda_math::rope_pair)
  int rope_origin = 0;   // table row = position - rope_origin (prefill_position_reset fault)
  int write_offset = 0;  // K/V of position p stored at row p + write_offset (kv_write_next: 1)
  int max_ctx = 0;       // cache rows; an entry for a row >= max_ctx is dropped
};
// q: [n_tokens][n_head * head_dim], k, v: [n_tokens][n_head_kv * head_dim];
// caches: [max_ctx][n_head_kv * head_dim]; rope_cs: [rows][n_rot/2][2] (cos, sin) fp64.
cudaError_t launch_rope_store(float* q, const float* k, const float* v, float* k_cache,
                              float* v_cache, const double* rope_cs, const int32_t* d_params,
                              int n_tokens, const RopeParams& p, cudaStream_t stream);

// Attention of the batch over the layer's KV cache.
struct AttnParams {
  int n_head = 0, n_head_kv = 0, head_dim = 0;  // head_dim: attention_head_dim_supported
  int n_split = 1;                              // split-K partitions per (token, head)
  float scale = 0.0f;                           // score multiplier
  int window = 0;               // sliding window (0: full causal; cuda_math::attention_range)
  bool drop_newest = false;     // kv_position_off_by_one fault
  bool gqa_modulo = false;      // gqa_mapping fault: query head h reads KV head h % n_head_kv
  bool softmax_no_max = false;  // softmax_no_max fault (cuda_math::softmax_add_no_max)
  bool whole_chunk = false;     // causal_mask fault: every token sees the whole chunk
};
// Split-K (flash-decoding): `n_split` partial softmax states per (token, head)
// are written to `partial` ([n_tokens][n_head][n_split][head_dim + 2]) and
// merged in order into out ([n_tokens][n_head * head_dim]). GQA: query head h
// reads KV head h / (n_head / n_head_kv). KV range: cuda_math::attention_range.
cudaError_t launch_attention(const float* q, const float* k_cache, const float* v_cache,
                             float* partial, float* out, const int32_t* d_params, int n_tokens,
                             const AttnParams& p, cudaStream_t stream);

// gate[i] = act(gate[i]) * up[i], i < n; act = SiLU (cuda_math::silu_mul) or
// tanh-GELU when gelu (cuda_math::gelu_mul).
cudaError_t launch_gated_act(float* gate, const float* up, int64_t n, bool gelu,
                             cudaStream_t stream);

// y[r][i] = y[r][i] + bias[i] (fp64 add, rounded once), r < n_rows, i < n.
cudaError_t launch_add_bias(float* y, const float* bias, int n_rows, int n, cudaStream_t stream);

// x[i] = cap * tanh(x[i] / cap), i < n (cuda_math::softcap).
cudaError_t launch_softcap(float* x, int64_t n, double cap, cudaStream_t stream);

// x[i] = round_fp16(x[i]), i < n (the fp16_accumulation fault).
cudaError_t launch_round_fp16(float* x, int64_t n, cudaStream_t stream);

// acc[i] = (first ? 0 : acc[i]) + round_fp16(part[i]) in fp32, i < n: one slice
// of the split-K reduction faults (thread_order_reduction, session_order_reduction).
cudaError_t launch_add_fp16_partial(float* acc, const float* part, int64_t n, bool first,
                                    cudaStream_t stream);

// *out = argmax(logits[0..n)) with ties to the lowest id, NaN skipped (-1 if all NaN).
cudaError_t launch_argmax(const float* logits, int n, int32_t* out, cudaStream_t stream);

// head_dim the attention kernel is compiled for: 16, 32, 64, 128, 256.
bool attention_head_dim_supported(int head_dim);

}  // namespace touchstone::cuda
