// kernels.h - launchers of the CUDA backend's kernels (kernels.cu). Plain C++:
// included by cuda_backend.cpp (g++). Every launcher enqueues on `stream` and
// returns cudaGetLastError(); nothing here allocates or synchronizes, so every
// launcher can be captured into a CUDA graph.
//
// Device-side parameters: `d_pos` points to the position of the first token of
// the batch, `d_tokens` to the batch's token ids. Kernels read them from device
// memory so that a captured decode graph stays valid for every position.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "touchstone/cuda/kernel_math.h"

namespace touchstone::cuda {

using cuda_math::WType;

// x[i][:] = row d_tokens[i] of the embedding matrix (type, n_embd wide), i < n_tokens.
cudaError_t launch_get_rows(WType type, const void* table, const int32_t* d_tokens, int n_tokens,
                            int n_embd, float* x, cudaStream_t stream);

// Per row r < n_rows: if delta, x[r] += delta[r] (fp64 add, rounded); then
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (fp64 accumulation).
cudaError_t launch_add_rmsnorm(float* x, const float* delta, const float* w, float* out, int n_rows,
                               int n, double eps, cudaStream_t stream);

// y[o] = W[o, :] . x for o < n_out (W: n_out rows of `type`, n_in wide); one warp
// per row, the order of cuda_math::row_dot_emulated.
cudaError_t launch_matvec(WType type, const void* W, const float* x, float* y, int n_out, int n_in,
                          cudaStream_t stream);

// out[r][c] = dequantized W[r][c] (fp32, row-major), all rows.
cudaError_t launch_dequantize(WType type, const void* W, float* out, int n_rows, int n_in,
                              cudaStream_t stream);

// RoPE of q (in place) and k for the batch, then K/V appended to the layer's
// cache at positions *d_pos + i. rope_cs: [max_ctx][head_dim/2][2] (cos, sin) in fp64.
cudaError_t launch_rope_store(float* q, const float* k, const float* v, float* k_cache,
                              float* v_cache, const double* rope_cs, const int32_t* d_pos,
                              int n_tokens, int n_head, int n_head_kv, int head_dim,
                              cudaStream_t stream);

// Causal GQA attention of the batch over the layer's KV cache, split-K
// (flash-decoding): `n_split` partial softmax states per (token, head) are
// written to `partial` ([n_tokens][n_head][n_split][head_dim + 2]) and merged
// in order into out ([n_tokens][n_head * head_dim]). head_dim: 64 or 128.
cudaError_t launch_attention(const float* q, const float* k_cache, const float* v_cache,
                             float* partial, float* out, const int32_t* d_pos, int n_tokens,
                             int n_head, int n_head_kv, int head_dim, int n_split,
                             cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i], i < n.
cudaError_t launch_swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream);

// *out = argmax(logits[0..n)) with ties to the lowest id, NaN skipped (-1 if all NaN).
cudaError_t launch_argmax(const float* logits, int n, int32_t* out, cudaStream_t stream);

bool attention_head_dim_supported(int head_dim);

}  // namespace touchstone::cuda
