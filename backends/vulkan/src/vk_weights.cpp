// vk_weights.cpp - GGUF tensors -> device buffers.
#include "vk_weights.h"

#include <string>

#include "touchstone/quant.h"
#include "vk_blocks.h"
#include "vk_kernels.h"

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

DeviceMatrix upload_matrix(Context& ctx, const gguf::File& f, const std::string& name, int64_t n_in,
                           int64_t n_out, bool quantized, uint64_t& total) {
  const gguf::TensorInfo& t = tensor(f, name, uint64_t(n_in), uint64_t(n_out));
  DeviceMatrix m;
  m.n_in = uint32_t(n_in);
  m.n_out = uint32_t(n_out);
  const bool raw =
      (quantized || t.type == TensorType::F32) && shader_reads(t.type) &&
      n_in % int64_t(gguf::type_traits(t.type).block_size * (t.type == TensorType::F32 ? 4 : 1)) ==
          0;
  if (raw) {
    const auto bytes = f.tensor_data(t);
    m.type = t.type;
    if (t.type == TensorType::F32) {
      m.buf = Buffer(ctx, bytes.size(), Buffer::Kind::Device);
      m.buf.upload(bytes.data(), bytes.size());
    } else {
      const std::vector<uint8_t> split =
          to_device_blocks(t.type, bytes.data(), size_t(n_in), size_t(n_out));
      m.buf = Buffer(ctx, split.size(), Buffer::Kind::Device);
      m.buf.upload(split.data(), split.size());
    }
  } else {
    if (n_in % 4 != 0)
      throw StatusError(TS_ERR_UNSUPPORTED, name + ": row length not a multiple of 4");
    const std::vector<float> v = gguf::dequantize(f, t);
    m.type = TensorType::F32;
    m.buf = Buffer(ctx, v.size() * sizeof(float), Buffer::Kind::Device);
    m.buf.upload(v.data(), v.size() * sizeof(float));
  }
  total += m.buf.size();
  return m;
}

Buffer upload_vector(Context& ctx, const gguf::File& f, const std::string& name, int64_t n,
                     uint64_t& total) {
  const std::vector<float> v = gguf::dequantize(f, tensor(f, name, uint64_t(n), 1));
  Buffer b(ctx, v.size() * sizeof(float), Buffer::Kind::Device);
  b.upload(v.data(), v.size() * sizeof(float));
  total += b.size();
  return b;
}

}  // namespace

std::unique_ptr<DeviceWeights> upload_weights(Context& ctx, const gguf::File& f,
                                              const ModelConfig& c, bool quantized) {
  auto w = std::make_unique<DeviceWeights>();
  w->config = c;
  w->quantized = quantized;
  uint64_t& total = w->device_bytes;
  const int64_t d = c.n_embd, q_dim = int64_t{c.n_head} * c.head_dim,
                kv_dim = int64_t{c.n_head_kv} * c.head_dim;
  w->token_embd = upload_matrix(ctx, f, "token_embd.weight", d, c.n_vocab, quantized, total);
  if (!c.tied_embeddings)
    w->output = upload_matrix(ctx, f, "output.weight", d, c.n_vocab, quantized, total);
  w->output_norm = upload_vector(ctx, f, "output_norm.weight", d, total);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    DeviceLayer L;
    L.attn_norm = upload_vector(ctx, f, p + "attn_norm.weight", d, total);
    L.ffn_norm = upload_vector(ctx, f, p + "ffn_norm.weight", d, total);
    L.wq = upload_matrix(ctx, f, p + "attn_q.weight", d, q_dim, quantized, total);
    L.wk = upload_matrix(ctx, f, p + "attn_k.weight", d, kv_dim, quantized, total);
    L.wv = upload_matrix(ctx, f, p + "attn_v.weight", d, kv_dim, quantized, total);
    L.wo = upload_matrix(ctx, f, p + "attn_output.weight", q_dim, d, quantized, total);
    L.gate = upload_matrix(ctx, f, p + "ffn_gate.weight", d, c.n_ff, quantized, total);
    L.up = upload_matrix(ctx, f, p + "ffn_up.weight", d, c.n_ff, quantized, total);
    L.down = upload_matrix(ctx, f, p + "ffn_down.weight", c.n_ff, d, quantized, total);
    w->layers.push_back(std::move(L));
  }
  ctx.check_validation();
  return w;
}

}  // namespace touchstone::vk
