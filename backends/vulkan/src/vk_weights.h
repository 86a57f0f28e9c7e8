// vk_weights.h - the model's weights on the device, for one weight path.
//
// full_precision: every tensor dequantized to fp32 on the host, uploaded once.
// quantized: F32 tensors as they are, the block types the shaders read
// (shader_reads, vk_kernels.h) as their GGUF blocks in the device layout of
// vk_blocks.h, dequantized inside the shaders; any other type (F16, BF16, ...)
// is dequantized to fp32 at load.
//
// Fused tensors (Phi-3's attn_qkv = [q; k; v] rows, ffn_up = [gate; up] rows)
// are split at load into their row ranges, as model/core/src/model_weights.cpp
// does; the blocks of a row are contiguous, so the split keeps the bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "vk_buffer.h"

namespace touchstone::vk {

// Rows [row0, row0 + n_rows) of a matrix in one buffer.
struct MatrixPart {
  uint32_t row0 = 0, n_rows = 0;
  Buffer buf;
};

// A weight matrix in row ranges, each buffer within the device's
// maxStorageBufferRange (one part unless the matrix is larger, e.g. a
// 262,144-row LM head).
struct DeviceMatrix {
  gguf::TensorType type = gguf::TensorType::F32;  // layout of every part's buffer
  uint32_t n_in = 0, n_out = 0;                   // row length, rows
  std::vector<MatrixPart> parts;
};

// One layer. The optional vectors (fp32) are empty Buffers (size() == 0) when
// the config does not use them.
struct DeviceLayer {
  Buffer attn_norm, ffn_norm;            // [n_embd]
  Buffer bq, bk, bv;                     // [q_dim], [kv_dim], [kv_dim]   (qkv_bias)
  Buffer q_norm, k_norm;                 // [head_dim]                    (qk_norm)
  Buffer post_attn_norm, post_ffn_norm;  // [n_embd]                      (post_norms)
  DeviceMatrix wq, wk, wv, wo, gate, up, down;
};

struct DeviceWeights {
  ModelConfig config;
  bool quantized = false;
  DeviceMatrix token_embd;  // also the LM head when embeddings are tied
  DeviceMatrix output;      // n_out == 0 when tied
  Buffer output_norm;
  std::vector<DeviceLayer> layers;
  std::vector<float> rope_freqs;  // [n_rot / 2] frequency divisors (rope_freqs.weight), or empty
  uint64_t device_bytes = 0;
  const DeviceMatrix& lm_head() const { return output.n_out ? output : token_embd; }
};

// Throws StatusError (TS_ERR_IO: a tensor missing or of the wrong shape;
// TS_ERR_UNSUPPORTED: a type that cannot be dequantized).
std::unique_ptr<DeviceWeights> upload_weights(Context& ctx, const gguf::File& file,
                                              const ModelConfig& config, bool quantized);

}  // namespace touchstone::vk
