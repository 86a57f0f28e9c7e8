// tiny_gptoss.h - a tiny random gpt-oss GGUF (architecture "gpt-oss"), for unit tests.
//
// Keys and tensors as llama.cpp's converter (convert_hf_to_gguf.py GptOssModel,
// llama-cpp-python 0.3.16) writes them: q/k/v/o biases, attn_sinks, the pre-FFN norm as
// post_attention_norm, router and expert biases, YaRN keys, sliding window. Values are
// deterministic pseudo-random fp32; options break the file for the refusal tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gguf_builder.h"

namespace touchstone::testing {

struct GptOssOptions {
  int n_layer = 2;
  uint32_t n_expert = 4;          // expert_count written
  uint32_t n_expert_tensors = 4;  // experts in the tensors
  uint32_t n_expert_used = 2;
  uint32_t sliding_window = 3;     // 0: not written
  std::string rope_type = "yarn";  // empty: rope.scaling.* not written
  float sink = 0.0f;               // 0: random sinks; else every sink logit = this
  float bias_scale = 0.4f;         // router / expert / attention bias magnitude
  std::string omit_tensor;         // a tensor not written ("blk.0.attn_sinks.weight")
  bool write_expert_ff = true;     // gpt-oss.expert_feed_forward_length
  uint64_t seed = 3;
};

inline std::vector<uint8_t> tiny_gptoss(const GptOssOptions& o) {
  namespace gg = touchstone::gguf;
  using gg::TensorType;
  using gg::ValueType;
  gg::testing::GgufBuilder g;
  const std::string a = "gpt-oss";
  const uint64_t d = 16, ff = 12, V = 32, n_head = 4, n_kv = 2, hd = 8;  // q_dim 32 != d
  g.key("general.architecture", ValueType::STRING).str(a);
  auto u32 = [&](const std::string& k, uint64_t v) {
    g.key(a + "." + k, ValueType::UINT32).put<uint32_t>(uint32_t(v));
  };
  auto f32 = [&](const std::string& k, float v) {
    g.key(a + "." + k, ValueType::FLOAT32).put<float>(v);
  };
  u32("block_count", uint64_t(o.n_layer));
  u32("context_length", 256);
  u32("vocab_size", V);
  u32("embedding_length", d);
  u32("feed_forward_length", ff);
  u32("attention.head_count", n_head);
  u32("attention.head_count_kv", n_kv);
  u32("attention.key_length", hd);
  u32("attention.value_length", hd);
  f32("rope.freq_base", 150000.0f);
  f32("attention.layer_norm_rms_epsilon", 1e-5f);
  u32("expert_count", o.n_expert);
  u32("expert_used_count", o.n_expert_used);
  if (o.write_expert_ff) u32("expert_feed_forward_length", ff);
  if (o.sliding_window) u32("attention.sliding_window", o.sliding_window);
  if (!o.rope_type.empty()) {
    g.key(a + ".rope.scaling.type", ValueType::STRING).str(o.rope_type);
    f32("rope.scaling.factor", 32.0f);
    u32("rope.scaling.original_context_length", 4096);
  }
  uint64_t state = o.seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {  // deterministic value in [-0.5, 0.5)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float((state >> 40) & 0xffffff) / float(1 << 24) - 0.5f;
  };
  auto t = [&](const std::string& name, std::vector<uint64_t> shape, float scale, float bias) {
    if (name == o.omit_tensor) return;
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& x : v) x = bias + scale * next();
    std::vector<uint8_t> bytes(n * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    g.tensor(name, shape, TensorType::F32, std::move(bytes));
  };
  const uint64_t ne = o.n_expert_tensors, q_dim = n_head * hd, kv_dim = n_kv * hd;
  const float bs = o.bias_scale;
  t("token_embd.weight", {d, V}, 1.0f, 0.0f);
  t("output_norm.weight", {d}, 0.2f, 1.0f);
  t("output.weight", {d, V}, 1.0f, 0.0f);
  for (int l = 0; l < o.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t(b + "attn_norm.weight", {d}, 0.2f, 1.0f);
    t(b + "attn_q.weight", {d, q_dim}, 0.6f, 0.0f);
    t(b + "attn_k.weight", {d, kv_dim}, 0.6f, 0.0f);
    t(b + "attn_v.weight", {d, kv_dim}, 0.6f, 0.0f);
    t(b + "attn_q.bias", {q_dim}, bs, 0.0f);
    t(b + "attn_k.bias", {kv_dim}, bs, 0.0f);
    t(b + "attn_v.bias", {kv_dim}, bs, 0.0f);
    t(b + "attn_output.weight", {q_dim, d}, 0.5f, 0.0f);
    t(b + "attn_output.bias", {d}, bs, 0.0f);
    t(b + "attn_sinks.weight", {n_head}, o.sink == 0.0f ? 2.0f : 0.0f, o.sink);
    t(b + "post_attention_norm.weight", {d}, 0.2f, 1.0f);
    t(b + "ffn_gate_inp.weight", {d, ne}, 2.0f, 0.0f);
    t(b + "ffn_gate_inp.bias", {ne}, bs, 0.0f);
    t(b + "ffn_gate_exps.weight", {d, ff, ne}, 3.0f, 0.0f);  // gates past the clamp
    t(b + "ffn_gate_exps.bias", {ff, ne}, bs, 0.0f);
    t(b + "ffn_up_exps.weight", {d, ff, ne}, 3.0f, 0.0f);
    t(b + "ffn_up_exps.bias", {ff, ne}, bs, 0.0f);
    t(b + "ffn_down_exps.weight", {ff, d, ne}, 0.5f, 0.0f);
    t(b + "ffn_down_exps.bias", {d, ne}, bs, 0.0f);
  }
  return g.build();
}

}  // namespace touchstone::testing
