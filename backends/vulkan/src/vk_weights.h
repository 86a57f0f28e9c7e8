// vk_weights.h - the model's weights on the device, for one weight path.
//
// full_precision: every tensor dequantized to fp32 on the host, uploaded once.
// quantized: F32 tensors as they are, Q4_0/Q4_1/Q8_0 as their GGUF blocks in
// the split layout of vk_blocks.h (same bytes, scales and quants apart),
// dequantized inside the shaders; any other type (F16, K-quants) is
// dequantized to fp32 at load (SmolLM2 Q4_1 needs none of those).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "touchstone/gguf.h"
#include "touchstone/llama_config.h"
#include "vk_buffer.h"

namespace touchstone::vk {

struct DeviceMatrix {
  gguf::TensorType type = gguf::TensorType::F32;  // layout of `buf`
  uint32_t n_in = 0, n_out = 0;                   // row length, rows
  Buffer buf;
};

struct DeviceLayer {
  Buffer attn_norm, ffn_norm;  // fp32 [n_embd]
  DeviceMatrix wq, wk, wv, wo, gate, up, down;
};

struct DeviceWeights {
  ModelConfig config;
  bool quantized = false;
  DeviceMatrix token_embd;  // also the LM head when embeddings are tied
  DeviceMatrix output;      // n_out == 0 when tied
  Buffer output_norm;
  std::vector<DeviceLayer> layers;
  uint64_t device_bytes = 0;
  const DeviceMatrix& lm_head() const { return output.n_out ? output : token_embd; }
};

std::unique_ptr<DeviceWeights> upload_weights(Context& ctx, const gguf::File& file,
                                              const ModelConfig& config, bool quantized);

}  // namespace touchstone::vk
