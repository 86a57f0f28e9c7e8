// vk_weights.cpp - GGUF tensors -> device buffers (every family of ModelConfig).
#include "vk_weights.h"

#include <algorithm>
#include <string>

#include "touchstone/model/quant.h"
#include "vk_kernels.h"
#include "vk_weight_rows.h"

namespace touchstone::vk {
namespace {

using abi::StatusError;
using gguf::TensorType;

const gguf::TensorInfo& tensor(const gguf::File& f, const std::string& name, uint64_t n_in,
                               uint64_t n_out) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw StatusError(TS_ERR_IO, f.path() + ": tensor '" + name + "' missing");
  const uint64_t rows = t->shape.size() > 1 ? t->shape[1] : 1;
  if (t->shape.empty() || t->shape[0] != n_in || rows != n_out) {
    throw StatusError(TS_ERR_IO, f.path() + ": tensor '" + name +
                                     "' has an unexpected shape (want " + std::to_string(n_in) +
                                     " x " + std::to_string(n_out) + ")");
  }
  return *t;
}

Buffer device_copy(Context& ctx, const void* data, size_t bytes, uint64_t& total) {
  Buffer b(ctx, bytes, Buffer::Kind::Device);
  b.upload(data, bytes);
  total += bytes;
  return b;
}

// Rows [row0, row0 + n_rows) of tensor t as a device matrix: in the tensor's own
// layout when the shaders read it (and the path keeps blocks), else dequantized to
// fp32 (vk_weight_rows.h); in parts of at most maxStorageBufferRange bytes.
DeviceMatrix rows_to_device(Context& ctx, const gguf::File& f, const gguf::TensorInfo& t,
                            size_t n_in, size_t row0, size_t n_rows, bool quantized,
                            uint64_t& total) {
  DeviceMatrix m;
  m.n_in = uint32_t(n_in);
  m.n_out = uint32_t(n_rows);
  m.type = device_type(t, n_in, quantized);
  const size_t row_bytes = file_row_bytes(t, n_in);
  const uint8_t* first = f.tensor_data(t).data() + row0 * row_bytes;
  const size_t per_part = rows_per_part(ctx, device_row_bytes(t, m.type, first, n_in));
  for (size_t r = 0; r < n_rows; r += per_part) {
    const size_t n = std::min(per_part, n_rows - r);
    const std::vector<uint8_t> dev =
        device_rows(t, m.type, first + r * row_bytes, row_bytes, n_in, n);
    m.parts.push_back(
        MatrixPart{uint32_t(r), uint32_t(n), device_copy(ctx, dev.data(), dev.size(), total)});
  }
  return m;
}

DeviceMatrix upload_matrix(Context& ctx, const gguf::File& f, const std::string& name, int64_t n_in,
                           int64_t n_out, bool quantized, uint64_t& total) {
  const gguf::TensorInfo& t = tensor(f, name, uint64_t(n_in), uint64_t(n_out));
  return rows_to_device(ctx, f, t, size_t(n_in), 0, size_t(n_out), quantized, total);
}

// A fused tensor of sum(parts) rows, split into one matrix per part.
std::vector<DeviceMatrix> upload_split(Context& ctx, const gguf::File& f, const std::string& name,
                                       int64_t n_in, const std::vector<int64_t>& parts,
                                       bool quantized, uint64_t& total) {
  int64_t n_out = 0;
  for (int64_t p : parts) n_out += p;
  const gguf::TensorInfo& t = tensor(f, name, uint64_t(n_in), uint64_t(n_out));
  std::vector<DeviceMatrix> out;
  size_t row0 = 0;
  for (int64_t p : parts) {
    out.push_back(rows_to_device(ctx, f, t, size_t(n_in), row0, size_t(p), quantized, total));
    row0 += size_t(p);
  }
  return out;
}

std::vector<float> read_vector(const gguf::File& f, const std::string& name, int64_t n) {
  return gguf::dequantize(f, tensor(f, name, uint64_t(n), 1));
}

Buffer upload_vector(Context& ctx, const gguf::File& f, const std::string& name, int64_t n,
                     uint64_t& total) {
  const std::vector<float> v = read_vector(f, name, n);
  return device_copy(ctx, v.data(), v.size() * sizeof(float), total);
}

// A 2-D table of n_out rows of n_in values (ggml shape {n_in, n_out}) as fp32: gpt-oss's
// per-expert biases.
Buffer upload_table(Context& ctx, const gguf::File& f, const std::string& name, int64_t n_in,
                    int64_t n_out, uint64_t& total) {
  const std::vector<float> v =
      gguf::dequantize(f, tensor(f, name, uint64_t(n_in), uint64_t(n_out)));
  return device_copy(ctx, v.data(), v.size() * sizeof(float), total);
}

void upload_attention(Context& ctx, const gguf::File& f, const ModelConfig& c, const std::string& p,
                      bool quantized, DeviceLayer& L, uint64_t& total) {
  const int64_t d = c.n_embd, hd = c.head_dim, q_dim = int64_t{c.n_head} * hd,
                kv_dim = int64_t{c.n_head_kv} * hd;
  L.attn_norm = upload_vector(ctx, f, p + "attn_norm.weight", d, total);
  if (c.fused_qkv) {
    auto qkv =
        upload_split(ctx, f, p + "attn_qkv.weight", d, {q_dim, kv_dim, kv_dim}, quantized, total);
    L.wq = std::move(qkv[0]);
    L.wk = std::move(qkv[1]);
    L.wv = std::move(qkv[2]);
  } else {
    L.wq = upload_matrix(ctx, f, p + "attn_q.weight", d, q_dim, quantized, total);
    L.wk = upload_matrix(ctx, f, p + "attn_k.weight", d, kv_dim, quantized, total);
    L.wv = upload_matrix(ctx, f, p + "attn_v.weight", d, kv_dim, quantized, total);
  }
  if (c.qkv_bias) {
    L.bq = upload_vector(ctx, f, p + "attn_q.bias", q_dim, total);
    L.bk = upload_vector(ctx, f, p + "attn_k.bias", kv_dim, total);
    L.bv = upload_vector(ctx, f, p + "attn_v.bias", kv_dim, total);
  }
  if (c.qk_norm) {
    L.q_norm = upload_vector(ctx, f, p + "attn_q_norm.weight", hd, total);
    L.k_norm = upload_vector(ctx, f, p + "attn_k_norm.weight", hd, total);
  }
  L.wo = upload_matrix(ctx, f, p + "attn_output.weight", q_dim, d, quantized, total);
  if (c.attn_out_bias) L.bo = upload_vector(ctx, f, p + "attn_output.bias", d, total);
  if (c.attn_sinks) L.sinks = upload_vector(ctx, f, p + "attn_sinks.weight", c.n_head, total);
  if (c.post_norms)
    L.post_attn_norm = upload_vector(ctx, f, p + "post_attention_norm.weight", d, total);
}

void upload_ffn(Context& ctx, const gguf::File& f, const ModelConfig& c, const std::string& p,
                bool quantized, DeviceLayer& L, uint64_t& total) {
  const int64_t d = c.n_embd, ff = c.n_ff;
  L.ffn_norm = upload_vector(ctx, f, p + ffn_norm_tensor(c), d, total);
  if (c.is_moe()) {  // router and experts (llama.cpp LLM_TENSOR_FFN_GATE_INP, FFN_*_EXPS)
    const int64_t ne = c.moe.n_expert, fe = c.moe.n_ff_exp;
    L.router = upload_matrix(ctx, f, p + "ffn_gate_inp.weight", d, ne, quantized, total);
    L.gate_exps = upload_experts(ctx, f, p + "ffn_gate_exps.weight", d, fe, ne, quantized, total);
    L.up_exps = upload_experts(ctx, f, p + "ffn_up_exps.weight", d, fe, ne, quantized, total);
    L.down_exps = upload_experts(ctx, f, p + "ffn_down_exps.weight", fe, d, ne, quantized, total);
    if (c.moe.biases) {  // gpt-oss (llm_build_openai_moe_iswa's *_b tensors)
      L.router_b = read_vector(f, p + "ffn_gate_inp.bias", ne);
      L.gate_exps_b = upload_table(ctx, f, p + "ffn_gate_exps.bias", fe, ne, total);
      L.up_exps_b = upload_table(ctx, f, p + "ffn_up_exps.bias", fe, ne, total);
      L.down_exps_b = upload_table(ctx, f, p + "ffn_down_exps.bias", d, ne, total);
    }
    if (c.moe.n_ff_shexp > 0) {  // qwen2moe (llama.cpp LLM_TENSOR_FFN_*_SHEXP)
      const int64_t fs = c.moe.n_ff_shexp;
      L.shexp_gate_inp =
          upload_matrix(ctx, f, p + "ffn_gate_inp_shexp.weight", d, 1, quantized, total);
      L.gate_shexp = upload_matrix(ctx, f, p + "ffn_gate_shexp.weight", d, fs, quantized, total);
      L.up_shexp = upload_matrix(ctx, f, p + "ffn_up_shexp.weight", d, fs, quantized, total);
      L.down_shexp = upload_matrix(ctx, f, p + "ffn_down_shexp.weight", fs, d, quantized, total);
    }
  } else if (c.fused_gate_up) {
    auto gu = upload_split(ctx, f, p + "ffn_up.weight", d, {ff, ff}, quantized, total);
    L.gate = std::move(gu[0]);
    L.up = std::move(gu[1]);
  } else {
    L.gate = upload_matrix(ctx, f, p + "ffn_gate.weight", d, ff, quantized, total);
    L.up = upload_matrix(ctx, f, p + "ffn_up.weight", d, ff, quantized, total);
  }
  if (!c.is_moe()) L.down = upload_matrix(ctx, f, p + "ffn_down.weight", ff, d, quantized, total);
  if (c.post_norms) L.post_ffn_norm = upload_vector(ctx, f, p + "post_ffw_norm.weight", d, total);
}

}  // namespace

std::unique_ptr<DeviceWeights> upload_weights(Context& ctx, const gguf::File& f,
                                              const ModelConfig& c, bool quantized) {
  auto w = std::make_unique<DeviceWeights>();
  w->config = c;
  w->quantized = quantized;
  uint64_t& total = w->device_bytes;
  const int64_t d = c.n_embd;
  w->token_embd = upload_matrix(ctx, f, "token_embd.weight", d, c.n_vocab, quantized, total);
  if (!c.tied_embeddings)
    w->output = upload_matrix(ctx, f, "output.weight", d, c.n_vocab, quantized, total);
  w->output_norm = upload_vector(ctx, f, "output_norm.weight", d, total);
  if (c.rope_freq_factors) w->rope_freqs = read_vector(f, "rope_freqs.weight", c.n_rot / 2);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    DeviceLayer L;
    upload_attention(ctx, f, c, p, quantized, L, total);
    upload_ffn(ctx, f, c, p, quantized, L, total);
    w->layers.push_back(std::move(L));
  }
  ctx.check_validation();
  return w;
}

}  // namespace touchstone::vk
