// gpt-oss (GGUF architecture "gpt-oss", HF GptOssForCausalLM): the router order
// (top-k on the logits, then softmax over the k), the clamped SwiGLU, attention sinks,
// YaRN frequencies, the config read from GGUF keys, the refusals of bad files, and the
// reference's forward pass on a tiny model (tiny_gptoss.h), with the fault
// attention_sinks_ignored.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tiny_gptoss.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/moe_router.h"
#include "touchstone/model/rope_yarn.h"
#include "touchstone/model/scalar_ops.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
namespace {

namespace gg = touchstone::gguf;
using testing::GptOssOptions;
using testing::tiny_gptoss;

TEST(GptOssRouter, TopKOnTheLogitsThenSoftmaxOverTheK) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f, -1.0f};
  const auto w = ops::route_top_k_softmax(logits, 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].expert, 1);
  EXPECT_EQ(w[1].expert, 2);
  // softmax over (3, 2) only: the others take no part.
  EXPECT_NEAR(w[0].weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(w[1].weight, std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(w[0].weight + w[1].weight, 1.0, 1e-15);
  // The same weights as softmax-then-top-k renormalised (Mixtral); not as softmax-then-top-k
  // without renormalisation, whose weights keep the mass of the experts left out.
  const auto mix = ops::route_softmax_top_k(logits, 2, true);
  const auto raw = ops::route_softmax_top_k(logits, 2, false);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(mix[i].expert, w[i].expert);
    EXPECT_NEAR(mix[i].weight, w[i].weight, 1e-15);
    EXPECT_LT(raw[i].weight, w[i].weight * 0.9);
  }
  // Ties: the lower expert index first; k = 1: weight 1.
  const auto tie = ops::route_top_k_softmax(std::vector<float>{0.5f, 2.0f, 2.0f, 2.0f}, 2);
  EXPECT_EQ(tie[0].expert, 1);
  EXPECT_EQ(tie[1].expert, 2);
  EXPECT_EQ(tie[0].weight, 0.5);
  EXPECT_EQ(ops::route_top_k_softmax(logits, 1)[0].weight, 1.0);
  EXPECT_THROW(ops::route_top_k_softmax(logits, 6), Error);
}

TEST(GptOssOps, ClampedSwiGLU) {
  auto ref = [](double g, double u) {  // HF GptOssExperts._apply_gate, written out
    g = std::min(g, 7.0);
    u = std::max(-7.0, std::min(u, 7.0));
    return (u + 1.0) * g / (1.0 + std::exp(-1.702 * g));
  };
  for (double g : {-9.0, -1.0, 0.0, 0.5, 3.0, 6.99, 7.0, 12.0})
    for (double u : {-20.0, -7.5, -1.0, 0.0, 2.0, 7.0, 8.0})
      EXPECT_EQ(ops::swiglu_oai(g, u), ref(g, u)) << g << " " << u;
  EXPECT_EQ(ops::swiglu_oai(100.0, 1.0), ops::swiglu_oai(7.0, 1.0));    // gate clamped above
  EXPECT_EQ(ops::swiglu_oai(2.0, -100.0), ops::swiglu_oai(2.0, -7.0));  // up clamped below
  EXPECT_EQ(ops::swiglu_oai(2.0, 100.0), ops::swiglu_oai(2.0, 7.0));    // and above
  EXPECT_EQ(ops::swiglu_oai(-3.0, -1.0), 0.0);                          // up + 1 = 0
  EXPECT_LT(ops::swiglu_oai(-40.0, 1.0), 0.0);  // the gate has no lower clamp
}

TEST(GptOssOps, YarnFrequencies) {
  // The released config: factor 32, beta 32 / 1, original context 4096, theta 150000;
  // head_dim 32 here: the correction range is [4.05, 8.70] (truncate false), [4, 9] rounded.
  RopeYarn y{32.0, 4096, 32.0, 1.0, false};
  const ops::YarnFrequencies fr = ops::yarn_frequencies(y, 32, 150000.0);
  ASSERT_EQ(fr.inv_freq.size(), 16u);
  EXPECT_NEAR(fr.mscale, 0.1 * std::log(32.0) + 1.0, 1e-15);
  const double pi = 3.14159265358979323846;
  const double lo = 32.0 * std::log(4096.0 / (32.0 * 2 * pi)) / (2 * std::log(150000.0));
  const double hi = 32.0 * std::log(4096.0 / (1.0 * 2 * pi)) / (2 * std::log(150000.0));
  for (int i = 0; i < 16; ++i) {
    const double base = std::pow(150000.0, -2.0 * i / 32.0);
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    EXPECT_NEAR(fr.inv_freq[size_t(i)], base / 32.0 * ramp + base * (1.0 - ramp), 1e-15 * base);
  }
  EXPECT_EQ(fr.inv_freq[0], 1.0);  // pair 0 extrapolated, the last interpolated
  EXPECT_NEAR(fr.inv_freq[15], std::pow(150000.0, -30.0 / 32.0) / 32.0, 1e-18);
  y.truncate = true;  // llama.cpp's rounding changes the pairs inside the range only
  const ops::YarnFrequencies t = ops::yarn_frequencies(y, 32, 150000.0);
  EXPECT_EQ(t.inv_freq[3], fr.inv_freq[3]);
  EXPECT_NE(t.inv_freq[5], fr.inv_freq[5]);
  EXPECT_EQ(t.inv_freq[10], fr.inv_freq[10]);
}

ModelConfig config_of(const GptOssOptions& o) {
  gg::testing::TempFile f(tiny_gptoss(o), "gptoss_config");
  return read_model_config(gg::File::open(f.path()));
}

ModelWeights load(const GptOssOptions& o) {
  gg::testing::TempFile f(tiny_gptoss(o), "gptoss_weights");
  return load_model_weights(gg::File::open(f.path()));
}

std::string refusal(const GptOssOptions& o) {
  try {
    load(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GptOssConfig, KeysAndFeatures) {
  const ModelConfig c = config_of(GptOssOptions{});
  EXPECT_EQ(c.family, Family::GptOss);
  EXPECT_EQ(std::string(family_name(c.family)), "gpt-oss");
  EXPECT_EQ(c.rope_style, RopeStyle::NeoX);
  EXPECT_TRUE(c.qkv_bias && c.attn_out_bias && c.attn_sinks);
  EXPECT_EQ(c.rope_yarn.factor, 32.0);
  EXPECT_EQ(c.rope_yarn.orig_ctx, 4096);
  EXPECT_FALSE(c.rope_yarn.truncate);
  EXPECT_EQ(c.moe.n_expert, 4);
  EXPECT_EQ(c.moe.n_ff_exp, 12);
  EXPECT_EQ(c.moe.router, MoeRouter::TopKSoftmax);
  EXPECT_EQ(c.moe.activation, ExpertActivation::SwiGLUOai);
  EXPECT_TRUE(c.moe.biases);
  ASSERT_EQ(c.layers.size(), 2u);
  EXPECT_EQ(c.layers[0].sliding_window, 3);  // even layers local, odd layers global
  EXPECT_EQ(c.layers[1].sliding_window, 0);
  EXPECT_EQ(c.feature_names(), (std::vector<std::string>{
                                   "neox_rope", "key_length_head_dim", "sliding_window", "qkv_bias",
                                   "moe", "yarn_rope", "attn_output_bias", "attention_sinks",
                                   "moe_topk_softmax", "moe_biases", "swiglu_oai"}));
  // A backend that computes every other feature is told the gpt-oss ones, by name.
  EXPECT_EQ(unsupported_features(c, "gpt-oss",
                                 "neox_rope,key_length_head_dim,sliding_window,qkv_bias,moe"),
            "YaRN RoPE scaling, attention output bias, attention sinks, MoE router: softmax over "
            "the top-k logits, router and expert biases, clamped SwiGLU (gpt-oss)");
  EXPECT_NE(unsupported_features(c, "llama,qwen3moe", "*").find("architecture 'gpt-oss'"),
            std::string::npos);
}

TEST(GptOssConfig, BadFilesAreRefusedNamingTheKeyOrTensor) {
  GptOssOptions o;
  o.n_expert = 8;  // expert_count 8, tensors of 4 experts
  EXPECT_NE(refusal(o).find("blk.0.ffn_gate_inp.weight"), std::string::npos) << refusal(o);
  o = GptOssOptions{};
  o.n_expert_used = 5;  // top-5 of 4
  EXPECT_NE(refusal(o).find("gpt-oss.expert_used_count"), std::string::npos) << refusal(o);
  o = GptOssOptions{};
  o.n_expert_used = 0;
  EXPECT_NE(refusal(o).find("gpt-oss.expert_used_count"), std::string::npos) << refusal(o);
  for (const char* t : {"blk.0.attn_sinks.weight", "blk.1.attn_output.bias",
                        "blk.0.ffn_gate_exps.bias", "blk.1.ffn_gate_inp.bias"}) {
    o = GptOssOptions{};
    o.omit_tensor = t;
    EXPECT_NE(refusal(o).find(t), std::string::npos) << t << ": " << refusal(o);
  }
  o = GptOssOptions{};
  o.rope_type = "linear";
  EXPECT_NE(refusal(o).find("gpt-oss.rope.scaling.type"), std::string::npos) << refusal(o);
  o = GptOssOptions{};
  o.sliding_window = 0;
  EXPECT_NE(refusal(o).find("gpt-oss.attention.sliding_window"), std::string::npos) << refusal(o);
  o = GptOssOptions{};
  o.write_expert_ff = false;
  EXPECT_NE(refusal(o).find("gpt-oss.expert_feed_forward_length"), std::string::npos) << refusal(o);
}

std::vector<std::vector<float>> run(const ModelWeights& w, int threads,
                                    std::vector<float>* taps = nullptr, Faults faults = {}) {
  const StoredWeights stored = stored_view(w);
  ReferenceTransformer ref(stored, 64, threads, faults);
  ref.set_taps(taps != nullptr);
  std::vector<std::vector<float>> out;
  for (int32_t t : {1, 7, 3, 30, 12, 5, 9, 2}) {
    out.emplace_back(size_t(w.config.n_vocab));
    ref.forward(t, out.back());
  }
  if (taps) *taps = ref.taps();
  return out;
}

TEST(GptOssReference, RunsAndIsDeterministicAcrossThreads) {
  const ModelWeights w = load(GptOssOptions{});
  const auto a = run(w, 1), b = run(w, 3);
  for (size_t p = 0; p < a.size(); ++p) {
    for (float v : a[p]) ASSERT_TRUE(std::isfinite(v)) << "position " << p;
    EXPECT_EQ(a[p], b[p]) << "position " << p << ": 1 vs 3 threads";
  }
  // Every feature is used: switching one off changes the logits.
  auto differs = [&](auto&& change) {
    ModelWeights m = load(GptOssOptions{});
    change(m);
    return run(m, 1) != a;
  };
  EXPECT_TRUE(differs([](ModelWeights& m) { m.config.rope_yarn.truncate = true; }));
  EXPECT_TRUE(differs([](ModelWeights& m) { m.config.layers[0].sliding_window = 0; }));
  EXPECT_TRUE(differs([](ModelWeights& m) {
    for (LayerWeights& L : m.layers) std::fill(L.sinks.begin(), L.sinks.end(), -INFINITY);
  }));
  EXPECT_TRUE(differs([](ModelWeights& m) {
    for (LayerWeights& L : m.layers) std::fill(L.gate_inp_b.begin(), L.gate_inp_b.end(), 0.0f);
  }));
  EXPECT_TRUE(differs([](ModelWeights& m) { m.config.moe.activation = ExpertActivation::SwiGLU; }));
}

// The attention_sinks_ignored fault computes the model whose sink logits are -inf (no
// term in the softmax), bit for bit, and differs from the model with its sinks.
TEST(GptOssReference, AttentionSinksIgnoredIsTheModelWithoutSinks) {
  ModelWeights without = load(GptOssOptions{});
  for (LayerWeights& L : without.layers) std::fill(L.sinks.begin(), L.sinks.end(), -INFINITY);
  const ModelWeights w = load(GptOssOptions{});
  const auto faulty = run(w, 1, nullptr, parse_fault("attention_sinks_ignored"));
  EXPECT_EQ(faulty, run(without, 1));
  EXPECT_NE(faulty, run(w, 1));
}

// A sink logit far above every score takes all the attention: each head's output is 0,
// so the attention block's output is exactly the output bias.
TEST(GptOssReference, AHugeSinkLeavesOnlyTheOutputBias) {
  GptOssOptions o;
  o.sink = 1000.0f;
  const ModelWeights w = load(o);
  std::vector<float> taps;
  run(w, 1, &taps);
  const size_t d = size_t(w.config.n_embd);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const float* attn = taps.data() + l * ReferenceTransformer::kTapPoints * d;
    for (size_t i = 0; i < d; ++i) EXPECT_EQ(attn[i], w.layers[l].bo[i]) << l << " " << i;
  }
}

}  // namespace
}  // namespace touchstone
