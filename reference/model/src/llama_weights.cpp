#include "touchstone/llama_weights.h"

#include "touchstone/error.h"
#include "touchstone/gguf.h"
#include "touchstone/quant.h"

#include <fmt/format.h>

namespace touchstone {
namespace {

// Dequantizes `name` after checking its ggml shape {ne0, ne1} (ne1 = 1 for vectors).
std::vector<float> load(const gguf::File& f, const std::string& name, int64_t ne0, int64_t ne1) {
  const gguf::TensorInfo& t = f.tensor(name);
  const bool is_vector = ne1 == 1;
  const bool ok = is_vector ? (t.shape.size() == 1 && static_cast<int64_t>(t.shape[0]) == ne0)
                            : (t.shape.size() == 2 && static_cast<int64_t>(t.shape[0]) == ne0 &&
                               static_cast<int64_t>(t.shape[1]) == ne1);
  if (!ok) {
    throw Error("{}: tensor '{}': shape [{}] does not match the expected [{}, {}]", f.path(), name,
                fmt::join(t.shape, ", "), ne0, ne1);
  }
  return gguf::dequantize(f, t);
}

}  // namespace

LlamaWeights load_llama_weights(const gguf::File& f) {
  LlamaWeights w;
  w.config = read_llama_config(f);
  const LlamaConfig& c = w.config;
  const int64_t d = c.n_embd, q_dim = int64_t{c.n_head} * c.head_dim,
                kv_dim = int64_t{c.n_head_kv} * c.head_dim;
  w.token_embd = load(f, "token_embd.weight", d, c.n_vocab);
  w.output_norm = load(f, "output_norm.weight", d, 1);
  if (!c.tied_embeddings) w.output = load(f, "output.weight", d, c.n_vocab);
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int32_t l = 0; l < c.n_layer; ++l) {
    LlamaLayerWeights& L = w.layers[static_cast<size_t>(l)];
    const std::string b = fmt::format("blk.{}.", l);
    L.attn_norm = load(f, b + "attn_norm.weight", d, 1);
    L.wq = load(f, b + "attn_q.weight", d, q_dim);
    L.wk = load(f, b + "attn_k.weight", d, kv_dim);
    L.wv = load(f, b + "attn_v.weight", d, kv_dim);
    L.wo = load(f, b + "attn_output.weight", q_dim, d);
    L.ffn_norm = load(f, b + "ffn_norm.weight", d, 1);
    L.w_gate = load(f, b + "ffn_gate.weight", d, c.n_ff);
    L.w_up = load(f, b + "ffn_up.weight", d, c.n_ff);
    L.w_down = load(f, b + "ffn_down.weight", c.n_ff, d);
  }
  return w;
}

}  // namespace touchstone
