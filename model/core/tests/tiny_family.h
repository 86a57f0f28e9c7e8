// tiny_family.h - tiny random GGUF models of every supported family, for unit tests.
//
// Shapes follow what llama.cpp's converter writes for the family (tensor names,
// fused Phi-3 projections, Qwen2 biases, QK-norm and post-norms of Qwen3/Gemma 3);
// values are deterministic pseudo-random fp32. Options add the extra key or tensor
// that a refusal test needs.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gguf_builder.h"

namespace touchstone::testing {

struct TinyOptions {
  std::string arch = "llama";
  int n_layer = 2;
  uint32_t sliding_window = 0;   // > 0: write {arch}.attention.sliding_window
  std::string extra_string_key;  // written with the value extra_string_value
  std::string extra_string_value = "yarn";
  std::string extra_tensor;  // an extra 1-D F32 tensor of n_embd values
  uint64_t seed = 1;
  // Optional features (0 / false: not written).
  uint32_t n_rot = 0;          // rope.dimension_count (partial rotary)
  bool rope_freqs = false;     // rope_freqs.weight (llama3 scaling), values in [1, 3)
  float linear_scale = 0.0f;   // rope.scaling.type = linear with this factor
  float softcap = 0.0f;        // final_logit_softcapping (gemma3)
  float freq_base_swa = 0.0f;  // rope.freq_base_swa (gemma3)
  // Mixture of experts (llama: Mixtral; qwen3moe): > 0 writes expert_count and the
  // router / expert tensors instead of the dense FFN's.
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 2;
  uint32_t expert_ff = 0;        // > 0: expert_feed_forward_length (else n_ff)
  int expert_weights_norm = -1;  // 0 / 1: write expert_weights_norm; -1: not written
};

inline std::vector<uint8_t> tiny_model(const TinyOptions& o) {
  namespace gg = touchstone::gguf;
  using gg::TensorType;
  using gg::ValueType;
  gg::testing::GgufBuilder g;
  const std::string a = o.arch;
  const bool gemma = a == "gemma3", qwen2 = a == "qwen2", phi3 = a == "phi3";
  const bool qwen3 = a == "qwen3" || a == "qwen3moe";  // the same attention
  const uint64_t d = 16, ff = 24, V = 32, n_head = 4, n_kv = 2;
  const uint64_t hd = (gemma || qwen3) ? 8 : d / n_head;  // key_length != d / n_head there
  g.key("general.architecture", ValueType::STRING).str(a);
  g.key("general.name", ValueType::STRING).str("tiny " + a);
  auto u32 = [&](const std::string& k, uint64_t v) {
    g.key(a + "." + k, ValueType::UINT32).put<uint32_t>(uint32_t(v));
  };
  u32("block_count", uint64_t(o.n_layer));
  u32("embedding_length", d);
  u32("feed_forward_length", ff);
  u32("attention.head_count", n_head);
  u32("attention.head_count_kv", n_kv);
  u32("context_length", 256);
  u32("vocab_size", V);
  if (gemma || qwen3) {
    u32("attention.key_length", hd);
    u32("attention.value_length", hd);
  }
  if (o.sliding_window) u32("attention.sliding_window", o.sliding_window);
  auto f32 = [&](const std::string& k, float v) {
    g.key(a + "." + k, ValueType::FLOAT32).put<float>(v);
  };
  if (o.n_rot) u32("rope.dimension_count", o.n_rot);
  f32("attention.layer_norm_rms_epsilon", 1e-6f);
  f32("rope.freq_base", gemma ? 1e6f : 10000.0f);
  if (o.linear_scale > 0.0f) {
    g.key(a + ".rope.scaling.type", ValueType::STRING).str("linear");
    f32("rope.scaling.factor", o.linear_scale);
  }
  if (o.softcap > 0.0f) f32("final_logit_softcapping", o.softcap);
  if (o.freq_base_swa > 0.0f) f32("rope.freq_base_swa", o.freq_base_swa);
  if (o.n_expert) {
    u32("expert_count", o.n_expert);
    u32("expert_used_count", o.n_expert_used);
    if (o.expert_ff) u32("expert_feed_forward_length", o.expert_ff);
    if (o.expert_weights_norm >= 0)
      g.key(a + ".expert_weights_norm", ValueType::BOOL)
          .put<uint8_t>(uint8_t(o.expert_weights_norm));
  }
  if (!o.extra_string_key.empty())
    g.key(o.extra_string_key, ValueType::STRING).str(o.extra_string_value);

  uint64_t state = o.seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {  // deterministic value in [-0.5, 0.5)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float((state >> 40) & 0xffffff) / float(1 << 24) - 0.5f;
  };
  auto t = [&](const std::string& name, std::vector<uint64_t> shape, float scale, float bias) {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& x : v) x = bias + scale * next();
    std::vector<uint8_t> bytes(n * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    g.tensor(name, shape, TensorType::F32, std::move(bytes));
  };
  t("token_embd.weight", {d, V}, 1.0f, 0.0f);
  t("output_norm.weight", {d}, 0.2f, 1.0f);
  if (a != "gemma3") t("output.weight", {d, V}, 1.0f, 0.0f);
  if (o.rope_freqs) t("rope_freqs.weight", {(o.n_rot ? o.n_rot : hd) / 2}, 2.0f, 2.0f);
  const uint64_t q_dim = n_head * hd, kv_dim = n_kv * hd;
  for (int l = 0; l < o.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t(b + "attn_norm.weight", {d}, 0.2f, 1.0f);
    if (phi3) {
      t(b + "attn_qkv.weight", {d, q_dim + 2 * kv_dim}, 0.6f, 0.0f);
    } else {
      t(b + "attn_q.weight", {d, q_dim}, 0.6f, 0.0f);
      t(b + "attn_k.weight", {d, kv_dim}, 0.6f, 0.0f);
      t(b + "attn_v.weight", {d, kv_dim}, 0.6f, 0.0f);
    }
    if (qwen2) {
      t(b + "attn_q.bias", {q_dim}, 0.2f, 0.0f);
      t(b + "attn_k.bias", {kv_dim}, 0.2f, 0.0f);
      t(b + "attn_v.bias", {kv_dim}, 0.2f, 0.0f);
    }
    if (gemma || qwen3) {
      t(b + "attn_q_norm.weight", {hd}, 0.2f, 1.0f);
      t(b + "attn_k_norm.weight", {hd}, 0.2f, 1.0f);
    }
    t(b + "attn_output.weight", {q_dim, d}, 0.5f, 0.0f);
    if (gemma) t(b + "post_attention_norm.weight", {d}, 0.2f, 1.0f);
    t(b + "ffn_norm.weight", {d}, 0.2f, 1.0f);
    const uint64_t eff = o.expert_ff ? o.expert_ff : ff, ne = o.n_expert;
    if (ne) {  // llama.cpp's shapes: router {d, n_expert}, experts 3-D
      t(b + "ffn_gate_inp.weight", {d, ne}, 2.0f, 0.0f);
      t(b + "ffn_gate_exps.weight", {d, eff, ne}, 0.5f, 0.0f);
      t(b + "ffn_up_exps.weight", {d, eff, ne}, 0.5f, 0.0f);
      t(b + "ffn_down_exps.weight", {eff, d, ne}, 0.5f, 0.0f);
    } else if (phi3) {
      t(b + "ffn_up.weight", {d, 2 * ff}, 0.5f, 0.0f);
    } else {
      t(b + "ffn_gate.weight", {d, ff}, 0.5f, 0.0f);
      t(b + "ffn_up.weight", {d, ff}, 0.5f, 0.0f);
    }
    if (!ne) t(b + "ffn_down.weight", {ff, d}, 0.5f, 0.0f);
    if (gemma) t(b + "post_ffw_norm.weight", {d}, 0.2f, 1.0f);
  }
  if (!o.extra_tensor.empty()) t(o.extra_tensor, {d}, 0.0f, 1.0f);
  return g.build();
}

// The family tests' cases (backends/*/tests/family_test.cpp): each family
// plainly (Gemma 3 with 7 layers, so layers 0-4 and 6 are local and 5 global;
// windows shorter than the tests' sequences), then variants with the optional
// features, each naming the canonical features (ModelConfig::feature_names)
// its model must report.
struct FamilyVariant {
  std::string name;
  TinyOptions options;
  std::vector<std::string> features;
};

inline std::vector<FamilyVariant> family_variants() {
  std::vector<FamilyVariant> out;
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma3", "phi3"}) {
    TinyOptions o;
    o.arch = arch;
    if (o.arch == "gemma3") {
      o.n_layer = 7;
      o.sliding_window = 3;
    }
    if (o.arch == "phi3") o.sliding_window = 4;
    out.push_back({std::string("tiny_") + arch, o, {}});
  }
  TinyOptions v;
  v.rope_freqs = true;
  v.linear_scale = 2.0f;
  v.sliding_window = 3;
  out.push_back({"llama_ropefreqs_linear_window",
                 v,
                 {"rope_freqs", "linear_rope_scaling", "sliding_window"}});
  v = TinyOptions{};
  v.arch = "phi3";
  v.n_rot = 2;
  v.sliding_window = 5;
  out.push_back({"phi3_partial_rotary", v, {"partial_rotary", "fused_qkv"}});
  v = TinyOptions{};
  v.arch = "gemma3";
  v.n_layer = 6;
  v.sliding_window = 2;
  v.softcap = 3.0f;
  v.freq_base_swa = 500.0f;
  v.linear_scale = 4.0f;
  out.push_back({"gemma3_softcap_swa_base_scaled",
                 v,
                 {"final_logit_softcap", "linear_rope_scaling", "per_layer_rope_base"}});
  return out;
}

// The mixture-of-experts tests' tiny cases (backends/*/tests/moe_test.cpp):
// Mixtral-style 4 experts top-2; Qwen3-MoE 8 experts top-3 with its own expert width,
// renormalised (no key) and not (expert_weights_norm = false).
inline std::vector<std::pair<std::string, TinyOptions>> moe_variants() {
  TinyOptions mixtral;
  mixtral.n_expert = 4;
  TinyOptions qwen = mixtral;
  qwen.arch = "qwen3moe";
  qwen.n_expert = 8;
  qwen.n_expert_used = 3;
  qwen.expert_ff = 40;
  TinyOptions qwen_plain = qwen;
  qwen_plain.expert_weights_norm = 0;
  qwen_plain.seed = 5;
  return {{"mixtral", mixtral}, {"qwen3moe", qwen}, {"qwen3moe_no_norm", qwen_plain}};
}

}  // namespace touchstone::testing
