// model_weights.cpp - fp32 weights of every supported family; see touchstone/model/model_weights.h.
#include "touchstone/model/model_weights.h"

#include <fmt/format.h>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/llama_weights.h"
#include "touchstone/model/quant.h"

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

// Dequantizes the 3-D expert tensor `name` after checking its ggml shape
// {ne0, ne1, n_expert}.
std::vector<float> load_experts(const gguf::File& f, const std::string& name, int64_t ne0,
                                int64_t ne1, int64_t n_expert) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.shape.size() != 3 || static_cast<int64_t>(t.shape[0]) != ne0 ||
      static_cast<int64_t>(t.shape[1]) != ne1 || static_cast<int64_t>(t.shape[2]) != n_expert) {
    throw Error("{}: tensor '{}': shape [{}] does not match the expected [{}, {}, {}]", f.path(),
                name, fmt::join(t.shape, ", "), ne0, ne1, n_expert);
  }
  return gguf::dequantize(f, t);
}

// Rows [begin, begin + n) of a row-major matrix with `cols` columns.
std::vector<float> rows(const std::vector<float>& m, int64_t begin, int64_t n, int64_t cols) {
  return std::vector<float>(m.begin() + begin * cols, m.begin() + (begin + n) * cols);
}

void load_attention(const gguf::File& f, const ModelConfig& c, const std::string& b,
                    LayerWeights& L) {
  const int64_t d = c.n_embd, hd = c.head_dim, q_dim = int64_t{c.n_head} * hd,
                kv_dim = int64_t{c.n_head_kv} * hd;
  L.attn_norm = load(f, b + "attn_norm.weight", d, 1);
  if (c.fused_qkv) {
    const std::vector<float> qkv = load(f, b + "attn_qkv.weight", d, q_dim + 2 * kv_dim);
    L.wq = rows(qkv, 0, q_dim, d);
    L.wk = rows(qkv, q_dim, kv_dim, d);
    L.wv = rows(qkv, q_dim + kv_dim, kv_dim, d);
  } else {
    L.wq = load(f, b + "attn_q.weight", d, q_dim);
    L.wk = load(f, b + "attn_k.weight", d, kv_dim);
    L.wv = load(f, b + "attn_v.weight", d, kv_dim);
  }
  if (c.qkv_bias) {
    L.bq = load(f, b + "attn_q.bias", q_dim, 1);
    L.bk = load(f, b + "attn_k.bias", kv_dim, 1);
    L.bv = load(f, b + "attn_v.bias", kv_dim, 1);
  }
  if (c.qk_norm) {
    L.q_norm = load(f, b + "attn_q_norm.weight", hd, 1);
    L.k_norm = load(f, b + "attn_k_norm.weight", hd, 1);
  }
  L.wo = load(f, b + "attn_output.weight", q_dim, d);
  if (c.attn_out_bias) L.bo = load(f, b + "attn_output.bias", d, 1);
  if (c.attn_sinks) L.sinks = load(f, b + "attn_sinks.weight", c.n_head, 1);
  if (c.post_norms) L.post_attn_norm = load(f, b + "post_attention_norm.weight", d, 1);
}

// Router {n_embd, n_expert} and experts (llama.cpp src/models/qwen3moe.cpp and
// llama-model.cpp's LLM_ARCH_LLAMA: ffn_gate_inp, ffn_{gate,up}_exps {n_embd, n_ff_exp,
// n_expert}, ffn_down_exps {n_ff_exp, n_embd, n_expert}).
void load_moe(const gguf::File& f, const ModelConfig& c, const std::string& b, LayerWeights& L) {
  const int64_t d = c.n_embd, ff = c.moe.n_ff_exp, n = c.moe.n_expert;
  L.ffn_gate_inp = load(f, b + "ffn_gate_inp.weight", d, n);
  L.gate_exps = load_experts(f, b + "ffn_gate_exps.weight", d, ff, n);
  L.up_exps = load_experts(f, b + "ffn_up_exps.weight", d, ff, n);
  L.down_exps = load_experts(f, b + "ffn_down_exps.weight", ff, d, n);
  if (c.moe.biases) {  // gpt-oss (llm_build_openai_moe_iswa's *_b tensors)
    L.gate_inp_b = load(f, b + "ffn_gate_inp.bias", n, 1);
    L.gate_exps_b = load(f, b + "ffn_gate_exps.bias", ff, n);
    L.up_exps_b = load(f, b + "ffn_up_exps.bias", ff, n);
    L.down_exps_b = load(f, b + "ffn_down_exps.bias", d, n);
  }
}

void load_ffn(const gguf::File& f, const ModelConfig& c, const std::string& b, LayerWeights& L) {
  const int64_t d = c.n_embd;
  L.ffn_norm = load(f, b + ffn_norm_tensor(c), d, 1);
  if (c.is_moe()) {
    load_moe(f, c, b, L);
  } else if (c.fused_gate_up) {
    const std::vector<float> gate_up = load(f, b + "ffn_up.weight", d, 2 * int64_t{c.n_ff});
    L.w_gate = rows(gate_up, 0, c.n_ff, d);
    L.w_up = rows(gate_up, c.n_ff, c.n_ff, d);
  } else {
    L.w_gate = load(f, b + "ffn_gate.weight", d, c.n_ff);
    L.w_up = load(f, b + "ffn_up.weight", d, c.n_ff);
  }
  if (!c.is_moe()) L.w_down = load(f, b + "ffn_down.weight", c.n_ff, d);
  if (c.post_norms) L.post_ffn_norm = load(f, b + "post_ffw_norm.weight", d, 1);
}

ModelWeights load_weights(const gguf::File& f, ModelConfig config) {
  ModelWeights w;
  w.config = std::move(config);
  const ModelConfig& c = w.config;
  const int64_t d = c.n_embd;
  w.token_embd = load(f, "token_embd.weight", d, c.n_vocab);
  w.output_norm = load(f, "output_norm.weight", d, 1);
  if (!c.tied_embeddings) w.output = load(f, "output.weight", d, c.n_vocab);
  if (c.rope_freq_factors) w.rope_freqs = load(f, "rope_freqs.weight", c.n_rot / 2, 1);
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    load_attention(f, c, b, w.layers[size_t(l)]);
    load_ffn(f, c, b, w.layers[size_t(l)]);
  }
  return w;
}

}  // namespace

ModelWeights load_model_weights(const gguf::File& f) {
  return load_weights(f, read_model_config(f));
}

ModelWeights load_llama_weights(const gguf::File& f) {
  return load_weights(f, read_llama_config(f));
}

}  // namespace touchstone
