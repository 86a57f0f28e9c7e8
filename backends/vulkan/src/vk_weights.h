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
#include <string>
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

// Rows [row0, row0 + n_rows) of one expert, in the byte range [offset, offset +
// bytes) of slab `slab`, laid out as a DeviceMatrix part of n_rows rows.
struct ExpertPart {
  uint32_t slab = 0, row0 = 0, n_rows = 0;
  uint64_t offset = 0, bytes = 0;
};

// The experts of one mixture-of-experts tensor, GGUF 3-D {n_in, n_out, n_expert}:
// expert e is rows [e n_out, (e + 1) n_out) of an n_expert n_out-row matrix. Each
// expert's rows are in the layout a DeviceMatrix of n_out rows has (fp32, split or
// padded blocks, vk_blocks.h), in parts of at most maxStorageBufferRange bytes,
// packed in expert order into slabs of at most that size, each part's start
// aligned to minStorageBufferOffsetAlignment. A matmul of expert e binds its
// parts' ranges of the slabs (range()): the experts are not copied per call.
struct DeviceExperts {
  gguf::TensorType type = gguf::TensorType::F32;  // layout of every part
  uint32_t n_in = 0, n_out = 0;                   // row length, rows per expert
  std::vector<Buffer> slabs;
  std::vector<std::vector<ExpertPart>> experts;  // [n_expert][row parts]
  BufferRange range(const ExpertPart& p) const { return {&slabs[p.slab], p.offset, p.bytes}; }
};

// One layer. The optional vectors (fp32) are empty Buffers (size() == 0) when
// the config does not use them.
struct DeviceLayer {
  Buffer attn_norm, ffn_norm;                   // [n_embd]
  Buffer bq, bk, bv;                            // [q_dim], [kv_dim], [kv_dim]   (qkv_bias)
  Buffer q_norm, k_norm;                        // [head_dim]                    (qk_norm)
  Buffer post_attn_norm, post_ffn_norm;         // [n_embd]                      (post_norms)
  DeviceMatrix wq, wk, wv, wo, gate, up, down;  // gate, up, down: dense FFN only
  DeviceMatrix router;                          // [n_expert][n_embd]            (moe)
  // gpt-oss: attention output bias [n_embd], sink logits [n_head]; the router's bias
  // [n_expert] on the host (the routing runs there); the experts' biases
  // [n_expert][n_ff_exp] (gate, up) and [n_expert][n_embd] (down).
  Buffer bo, sinks;
  std::vector<float> router_b;
  Buffer gate_exps_b, up_exps_b, down_exps_b;
  DeviceExperts gate_exps, up_exps, down_exps;  // [n_ff_exp][n_embd], [n_embd][n_ff_exp]
  // Shared expert (qwen2moe: moe.n_ff_shexp > 0): its gate as a 1 x n_embd matrix
  // (ffn_gate_inp_shexp) and its gated FFN (ffn_{gate,up,down}_shexp).
  DeviceMatrix shexp_gate_inp, gate_shexp, up_shexp, down_shexp;
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

// Places n_expert experts of m.n_out rows (dev_row device bytes each) into
// m.experts: parts of at most per_part rows, packed in expert order into slabs of
// at most `cap` bytes (a part larger than cap gets a slab of its own), each part's
// offset a multiple of `align`. Returns the slabs' sizes in bytes.
std::vector<uint64_t> plan_expert_slabs(DeviceExperts& m, size_t n_expert, size_t per_part,
                                        uint64_t dev_row, uint64_t cap, uint64_t align);

// The 3-D expert tensor `name`, ggml shape {n_in, n_out, n_expert}, in slabs
// (vk_experts.cpp). Throws as upload_weights.
DeviceExperts upload_experts(Context& ctx, const gguf::File& file, const std::string& name,
                             int64_t n_in, int64_t n_out, int64_t n_expert, bool quantized,
                             uint64_t& total);

// Throws StatusError (TS_ERR_IO: a tensor missing or of the wrong shape;
// TS_ERR_UNSUPPORTED: a type that cannot be dequantized).
std::unique_ptr<DeviceWeights> upload_weights(Context& ctx, const gguf::File& file,
                                              const ModelConfig& config, bool quantized);

}  // namespace touchstone::vk
