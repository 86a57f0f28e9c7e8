// model_weights.cpp - the weights of every supported family, dequantized (ModelWeights) or
// as stored (StoredWeights); see touchstone/model/model_weights.h.
#include "touchstone/model/model_weights.h"

#include <fmt/format.h>

#include <memory>
#include <span>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/quant.h"

namespace touchstone {
namespace {

// Checks that `name` has the ggml shape {ne0, ne1} (ne1 = 1 for vectors).
const gguf::TensorInfo& checked(const gguf::File& f, const std::string& name, int64_t ne0,
                                int64_t ne1) {
  const gguf::TensorInfo& t = f.tensor(name);
  const bool is_vector = ne1 == 1;
  const bool ok = is_vector ? (t.shape.size() == 1 && static_cast<int64_t>(t.shape[0]) == ne0)
                            : (t.shape.size() == 2 && static_cast<int64_t>(t.shape[0]) == ne0 &&
                               static_cast<int64_t>(t.shape[1]) == ne1);
  if (!ok) {
    throw Error("{}: tensor '{}': shape [{}] does not match the expected [{}, {}]", f.path(), name,
                fmt::join(t.shape, ", "), ne0, ne1);
  }
  return t;
}

// Checks that the 3-D expert tensor `name` has the ggml shape {ne0, ne1, n_expert}.
const gguf::TensorInfo& checked_experts(const gguf::File& f, const std::string& name, int64_t ne0,
                                        int64_t ne1, int64_t n_expert) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.shape.size() != 3 || static_cast<int64_t>(t.shape[0]) != ne0 ||
      static_cast<int64_t>(t.shape[1]) != ne1 || static_cast<int64_t>(t.shape[2]) != n_expert) {
    throw Error("{}: tensor '{}': shape [{}] does not match the expected [{}, {}, {}]", f.path(),
                name, fmt::join(t.shape, ", "), ne0, ne1, n_expert);
  }
  return t;
}

// A tensor of n_rows rows of ne0 values as the loader's matrix type: dequantized, or
// read in place (the type checked as gguf::dequantize checks it, naming the tensor).
void materialise(const gguf::File& f, const gguf::TensorInfo& t, int64_t n_rows,
                 std::vector<float>& out) {
  (void)n_rows;
  out = gguf::dequantize(f, t);
}
void materialise(const gguf::File& f, const gguf::TensorInfo& t, int64_t n_rows,
                 WeightMatrix& out) {
  if (!gguf::can_dequantize(t.type)) {
    throw Error("{}: tensor '{}': dequantization of type {} is not supported", f.path(), t.name,
                gguf::type_name(t.type));
  }
  const std::span<const uint8_t> bytes = f.tensor_data(t);
  out = WeightMatrix(t.type, bytes.data(), n_rows, static_cast<int64_t>(t.shape[0]));
}

std::vector<float> load(const gguf::File& f, const std::string& name, int64_t ne0, int64_t ne1) {
  return gguf::dequantize(f, checked(f, name, ne0, ne1));
}

// A vector of ne0 values stored as ggml shape {ne0} or {ne0, 1} (a one-row matrix, as
// convert_hf_to_gguf.py writes HF's Linear(n_embd, 1) weight: qwen2moe's
// ffn_gate_inp_shexp; llama.cpp creates it as {n_embd} and accepts either).
std::vector<float> load_row(const gguf::File& f, const std::string& name, int64_t ne0) {
  const gguf::TensorInfo& t = f.tensor(name);
  const bool ok = !t.shape.empty() && t.shape.size() <= 2 &&
                  static_cast<int64_t>(t.shape[0]) == ne0 &&
                  (t.shape.size() == 1 || t.shape[1] == 1);
  if (!ok) {
    throw Error("{}: tensor '{}': shape [{}] does not match the expected [{}] or [{}, 1]", f.path(),
                name, fmt::join(t.shape, ", "), ne0, ne0);
  }
  return gguf::dequantize(f, t);
}

template <class M>
M load_matrix(const gguf::File& f, const std::string& name, int64_t ne0, int64_t ne1) {
  M m;
  materialise(f, checked(f, name, ne0, ne1), ne1, m);
  return m;
}

// Expert e's matrix is rows [e * ne1, (e + 1) * ne1) of the result.
template <class M>
M load_experts(const gguf::File& f, const std::string& name, int64_t ne0, int64_t ne1,
               int64_t n_expert) {
  M m;
  materialise(f, checked_experts(f, name, ne0, ne1, n_expert), ne1 * n_expert, m);
  return m;
}

// Rows [begin, begin + n) of a row-major matrix with `cols` columns.
std::vector<float> rows(const std::vector<float>& m, int64_t begin, int64_t n, int64_t cols) {
  return std::vector<float>(m.begin() + begin * cols, m.begin() + (begin + n) * cols);
}
WeightMatrix rows(const WeightMatrix& m, int64_t begin, int64_t n, int64_t cols) {
  (void)cols;
  return m.slice(begin, n);
}

template <class M>
void load_attention(const gguf::File& f, const ModelConfig& c, const std::string& b,
                    BasicLayerWeights<M>& L) {
  const int64_t d = c.n_embd, hd = c.head_dim, q_dim = int64_t{c.n_head} * hd,
                kv_dim = int64_t{c.n_head_kv} * hd;
  L.attn_norm = load(f, b + "attn_norm.weight", d, 1);
  if (c.fused_qkv) {
    const M qkv = load_matrix<M>(f, b + "attn_qkv.weight", d, q_dim + 2 * kv_dim);
    L.wq = rows(qkv, 0, q_dim, d);
    L.wk = rows(qkv, q_dim, kv_dim, d);
    L.wv = rows(qkv, q_dim + kv_dim, kv_dim, d);
  } else {
    L.wq = load_matrix<M>(f, b + "attn_q.weight", d, q_dim);
    L.wk = load_matrix<M>(f, b + "attn_k.weight", d, kv_dim);
    L.wv = load_matrix<M>(f, b + "attn_v.weight", d, kv_dim);
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
  L.wo = load_matrix<M>(f, b + "attn_output.weight", q_dim, d);
  if (c.attn_out_bias) L.bo = load(f, b + "attn_output.bias", d, 1);
  if (c.attn_sinks) L.sinks = load(f, b + "attn_sinks.weight", c.n_head, 1);
  if (c.post_norms) L.post_attn_norm = load(f, b + "post_attention_norm.weight", d, 1);
}

// Router {n_embd, n_expert} and experts (llama.cpp src/models/qwen3moe.cpp and
// llama-model.cpp's LLM_ARCH_LLAMA: ffn_gate_inp, ffn_{gate,up}_exps {n_embd, n_ff_exp,
// n_expert}, ffn_down_exps {n_ff_exp, n_embd, n_expert}).
template <class M>
void load_moe(const gguf::File& f, const ModelConfig& c, const std::string& b,
              BasicLayerWeights<M>& L) {
  const int64_t d = c.n_embd, ff = c.moe.n_ff_exp, n = c.moe.n_expert;
  L.ffn_gate_inp = load_matrix<M>(f, b + "ffn_gate_inp.weight", d, n);
  L.gate_exps = load_experts<M>(f, b + "ffn_gate_exps.weight", d, ff, n);
  L.up_exps = load_experts<M>(f, b + "ffn_up_exps.weight", d, ff, n);
  L.down_exps = load_experts<M>(f, b + "ffn_down_exps.weight", ff, d, n);
  if (c.moe.biases) {  // gpt-oss (llm_build_openai_moe_iswa's *_b tensors)
    L.gate_inp_b = load(f, b + "ffn_gate_inp.bias", n, 1);
    L.gate_exps_b = load(f, b + "ffn_gate_exps.bias", ff, n);
    L.up_exps_b = load(f, b + "ffn_up_exps.bias", ff, n);
    L.down_exps_b = load(f, b + "ffn_down_exps.bias", d, n);
  }
  if (c.moe.n_ff_shexp > 0) {  // qwen2moe (llama_model_qwen2moe::load_arch_tensors)
    const int64_t fs = c.moe.n_ff_shexp;
    L.gate_inp_shexp = load_row(f, b + "ffn_gate_inp_shexp.weight", d);
    L.gate_shexp = load_matrix<M>(f, b + "ffn_gate_shexp.weight", d, fs);
    L.up_shexp = load_matrix<M>(f, b + "ffn_up_shexp.weight", d, fs);
    L.down_shexp = load_matrix<M>(f, b + "ffn_down_shexp.weight", fs, d);
  }
}

template <class M>
void load_ffn(const gguf::File& f, const ModelConfig& c, const std::string& b,
              BasicLayerWeights<M>& L) {
  const int64_t d = c.n_embd;
  L.ffn_norm = load(f, b + ffn_norm_tensor(c), d, 1);
  if (c.is_moe()) {
    load_moe(f, c, b, L);
  } else if (c.fused_gate_up) {
    const M gate_up = load_matrix<M>(f, b + "ffn_up.weight", d, 2 * int64_t{c.n_ff});
    L.w_gate = rows(gate_up, 0, c.n_ff, d);
    L.w_up = rows(gate_up, c.n_ff, c.n_ff, d);
  } else {
    L.w_gate = load_matrix<M>(f, b + "ffn_gate.weight", d, c.n_ff);
    L.w_up = load_matrix<M>(f, b + "ffn_up.weight", d, c.n_ff);
  }
  if (!c.is_moe()) L.w_down = load_matrix<M>(f, b + "ffn_down.weight", c.n_ff, d);
  if (c.post_norms) L.post_ffn_norm = load(f, b + "post_ffw_norm.weight", d, 1);
}

template <class M>
BasicModelWeights<M> load_weights(const gguf::File& f, ModelConfig config) {
  BasicModelWeights<M> w;
  w.config = std::move(config);
  const ModelConfig& c = w.config;
  const int64_t d = c.n_embd;
  w.token_embd = load_matrix<M>(f, "token_embd.weight", d, c.n_vocab);
  w.output_norm = load(f, "output_norm.weight", d, 1);
  if (!c.tied_embeddings) w.output = load_matrix<M>(f, "output.weight", d, c.n_vocab);
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
  return load_weights<std::vector<float>>(f, read_model_config(f));
}

StoredWeights load_stored_weights(std::shared_ptr<const gguf::File> file) {
  if (!file) throw Error("load_stored_weights: no file");
  StoredWeights w = load_weights<WeightMatrix>(*file, read_model_config(*file));
  w.file = std::move(file);
  return w;
}

namespace {

WeightMatrix f32_view(const std::vector<float>& m, int64_t n_in) {
  if (m.empty()) return {};
  return WeightMatrix(gguf::TensorType::F32, reinterpret_cast<const uint8_t*>(m.data()),
                      int64_t(m.size()) / n_in, n_in);
}

// Calls fn(matrix) for every matrix of w.
template <class W, class Fn>
void for_each_matrix(W& w, Fn&& fn) {
  fn(w.token_embd);
  fn(w.output);
  for (auto& L : w.layers) {
    for (auto* m :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.ffn_gate_inp, &L.gate_exps,
          &L.up_exps, &L.down_exps, &L.gate_shexp, &L.up_shexp, &L.down_shexp})
      fn(*m);
  }
}

}  // namespace

uint64_t fp32_matrix_bytes(const StoredWeights& w) {
  uint64_t n = 0;
  for_each_matrix(w, [&](const WeightMatrix& m) { n += uint64_t(m.rows()) * uint64_t(m.cols()); });
  return 4 * n;
}

void expand_to_fp32(StoredWeights& w) {
  for_each_matrix(w, [](WeightMatrix& m) { m = m.expanded(); });
  w.file.reset();
}

StoredWeights stored_view(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const int64_t d = c.n_embd, q_dim = int64_t{c.n_head} * c.head_dim;
  StoredWeights s;
  s.config = c;
  s.token_embd = f32_view(w.token_embd, d);
  s.output_norm = w.output_norm;
  s.output = f32_view(w.output, d);
  s.rope_freqs = w.rope_freqs;
  for (const LayerWeights& L : w.layers) {
    StoredLayerWeights& S = s.layers.emplace_back();
    S.attn_norm = L.attn_norm;
    S.wq = f32_view(L.wq, d);
    S.wk = f32_view(L.wk, d);
    S.wv = f32_view(L.wv, d);
    S.bq = L.bq, S.bk = L.bk, S.bv = L.bv;
    S.q_norm = L.q_norm, S.k_norm = L.k_norm;
    S.wo = f32_view(L.wo, q_dim);
    S.bo = L.bo, S.sinks = L.sinks, S.post_attn_norm = L.post_attn_norm;
    S.ffn_norm = L.ffn_norm;
    S.w_gate = f32_view(L.w_gate, d);
    S.w_up = f32_view(L.w_up, d);
    S.w_down = f32_view(L.w_down, c.n_ff);
    S.post_ffn_norm = L.post_ffn_norm;
    if (c.is_moe()) {  // (a config made dense in memory may keep the expert vectors)
      S.ffn_gate_inp = f32_view(L.ffn_gate_inp, d);
      S.gate_exps = f32_view(L.gate_exps, d);
      S.up_exps = f32_view(L.up_exps, d);
      S.down_exps = f32_view(L.down_exps, c.moe.n_ff_exp);
    }
    S.gate_inp_b = L.gate_inp_b, S.gate_exps_b = L.gate_exps_b;
    S.up_exps_b = L.up_exps_b, S.down_exps_b = L.down_exps_b;
    if (c.is_moe() && c.moe.n_ff_shexp > 0) {
      S.gate_inp_shexp = L.gate_inp_shexp;
      S.gate_shexp = f32_view(L.gate_shexp, d);
      S.up_shexp = f32_view(L.up_shexp, d);
      S.down_shexp = f32_view(L.down_shexp, c.moe.n_ff_shexp);
    }
  }
  return s;
}

StoredWeights load_stored_weights(const std::string& path) {
  return load_stored_weights(std::make_shared<const gguf::File>(gguf::File::open(path)));
}

}  // namespace touchstone
