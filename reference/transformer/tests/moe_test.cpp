// Mixture-of-experts FFN (Mixtral: llama + expert_count; Qwen3-MoE: qwen3moe): the
// router maths of touchstone/model/moe_router.h (softmax, top-k with ties to the lower
// index, renormalisation on/off), the config read from GGUF keys, the refusals, and the
// reference's MoE layer against a dense layer with the same weights.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tiny_family.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/llama_config.h"
#include "touchstone/model/moe_router.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
namespace {

namespace gg = touchstone::gguf;
using testing::tiny_model;
using testing::TinyOptions;

std::vector<int32_t> experts(const std::vector<ops::ExpertWeight>& w) {
  std::vector<int32_t> out;
  for (const auto& e : w) out.push_back(e.expert);
  return out;
}

TEST(MoeRouter, SoftmaxTopKRenormalised) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  const double z = std::exp(-2.0) + 1.0 + std::exp(-1.0) + std::exp(-3.0);
  const std::vector<double> p = ops::softmax(logits);
  EXPECT_NEAR(p[1], 1.0 / z, 1e-15);
  EXPECT_NEAR(p[3], std::exp(-3.0) / z, 1e-15);
  // Mixtral / norm_topk_prob: the two selected weights sum to 1.
  const auto w = ops::route_softmax_top_k(logits, 2, true);
  ASSERT_EQ(experts(w), (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(w[0].weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(w[1].weight, std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(w[0].weight + w[1].weight, 1.0, 1e-15);
}

TEST(MoeRouter, NotRenormalisedKeepsTheSoftmaxProbabilities) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  const std::vector<double> p = ops::softmax(logits);
  const auto w = ops::route_softmax_top_k(logits, 2, false);  // Qwen3-MoE, norm_topk_prob false
  ASSERT_EQ(experts(w), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(w[0].weight, p[1]);
  EXPECT_EQ(w[1].weight, p[2]);
  EXPECT_LT(w[0].weight + w[1].weight, 1.0);
  // k = n_expert with renormalisation: every expert, weights = the softmax itself.
  const auto all = ops::route_softmax_top_k(logits, 4, true);
  ASSERT_EQ(experts(all), (std::vector<int32_t>{1, 2, 0, 3}));
  for (const auto& e : all) EXPECT_NEAR(e.weight, p[size_t(e.expert)], 1e-15);
}

TEST(MoeRouter, TiesGoToTheLowerExpertIndex) {
  EXPECT_EQ(ops::top_k_experts(std::vector<double>{0.1, 0.3, 0.3, 0.3}, 2),
            (std::vector<int32_t>{1, 2}));
  // ggml's selection sort (llama.cpp 0.3.16) picks {2, 1} here; torch.topk on CPU {2, 1}.
  EXPECT_EQ(ops::top_k_experts(std::vector<double>{2.0, 2.0, 3.0}, 2),
            (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(ops::top_k_experts(std::vector<double>(8, 0.125), 2), (std::vector<int32_t>{0, 1}));
  // Equal logits: uniform weights over the lowest k experts.
  const auto w = ops::route_softmax_top_k(std::vector<float>(8, 0.5f), 2, true);
  ASSERT_EQ(experts(w), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(w[0].weight, 0.5);
  EXPECT_EQ(w[1].weight, 0.5);
}

TEST(MoeRouter, BadKIsAnErrorAndNaNPropagates) {
  const std::vector<double> p = {0.5, 0.5};
  EXPECT_THROW(ops::top_k_experts(p, 0), Error);
  EXPECT_THROW(ops::top_k_experts(p, 3), Error);
  const auto w = ops::route_softmax_top_k(std::vector<float>{1.0f, NAN, 2.0f}, 2, true);
  ASSERT_EQ(w.size(), 2u);
  for (const auto& e : w) EXPECT_TRUE(std::isnan(e.weight));
  // NaN sorts after every number.
  EXPECT_EQ(ops::top_k_experts(std::vector<double>{NAN, 0.1, 0.2}, 2),
            (std::vector<int32_t>{2, 1}));
}

TinyOptions mixtral(uint32_t n_expert = 4, uint32_t k = 2) {
  TinyOptions o;
  o.n_expert = n_expert;
  o.n_expert_used = k;
  return o;
}

TinyOptions qwen3moe(int norm = -1) {
  TinyOptions o;
  o.arch = "qwen3moe";
  o.n_expert = 6;
  o.n_expert_used = 2;
  o.expert_ff = 12;
  o.expert_weights_norm = norm;
  return o;
}

ModelConfig config_of(const TinyOptions& o) {
  gg::testing::TempFile f(tiny_model(o), "moe_config");
  return read_model_config(gg::File::open(f.path()));
}

std::string refusal(const TinyOptions& o) {
  try {
    config_of(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoeConfig, MixtralAndQwen3MoeKeys) {
  const ModelConfig m = config_of(mixtral());
  EXPECT_EQ(m.family, Family::Llama);
  EXPECT_TRUE(m.is_moe());
  EXPECT_EQ(m.moe.n_expert, 4);
  EXPECT_EQ(m.moe.n_expert_used, 2);
  EXPECT_EQ(m.moe.n_ff_exp, m.n_ff);  // llama: experts are feed_forward_length wide
  EXPECT_TRUE(m.moe.norm_topk);
  EXPECT_EQ(m.feature_names(), (std::vector<std::string>{"moe"}));
  const ModelConfig q = config_of(qwen3moe());
  EXPECT_EQ(q.family, Family::Qwen3Moe);
  EXPECT_EQ(q.rope_style, RopeStyle::NeoX);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.moe.n_ff_exp, 12);
  EXPECT_TRUE(q.moe.norm_topk);  // no key: renormalised, as llama.cpp always does
  TinyOptions no_width = qwen3moe();
  no_width.expert_ff = 0;  // llama.cpp qwen3moe: n_ff_exp = n_ff / n_expert_used
  EXPECT_EQ(config_of(no_width).moe.n_ff_exp, q.n_ff / 2);
  EXPECT_FALSE(config_of(qwen3moe(0)).moe.norm_topk);
  EXPECT_TRUE(config_of(qwen3moe(1)).moe.norm_topk);
  EXPECT_FALSE(config_of(TinyOptions{}).is_moe());  // dense llama unchanged
}

TEST(MoeConfig, RefusalsNameTheKeyOrTensor) {
  TinyOptions o = mixtral();
  o.expert_weights_norm = 0;  // llama.cpp's llama graph always renormalises: not a llama key
  EXPECT_NE(refusal(o).find("llama.expert_weights_norm"), std::string::npos) << refusal(o);
  o = mixtral(4, 5);  // top-5 of 4
  EXPECT_NE(refusal(o).find("expert_used_count"), std::string::npos) << refusal(o);
  o = mixtral();
  o.extra_tensor = "blk.0.ffn_gate.weight";  // a dense FFN beside the experts
  EXPECT_NE(refusal(o).find("blk.0.ffn_gate.weight"), std::string::npos) << refusal(o);
  o = qwen3moe();
  o.n_expert = 0;  // qwen3moe without experts
  EXPECT_NE(refusal(o).find("expert_count"), std::string::npos) << refusal(o);
  o = qwen3moe();
  o.extra_string_key = "qwen3moe.expert_gating_func";
  EXPECT_NE(refusal(o).find("qwen3moe.expert_gating_func"), std::string::npos) << refusal(o);
  o = TinyOptions{};
  o.arch = "qwen3";
  o.n_expert = 4;  // Qwen3 dense has no expert keys
  EXPECT_NE(refusal(o).find("qwen3.expert_"), std::string::npos) << refusal(o);
}

// A backend that does not list "moe" (every optimized backend of this repository) is
// told what it lacks, in words; a plain-Llama reader refuses Mixtral.
TEST(MoeConfig, BackendsWithoutMoeAreToldTheMissingFeature) {
  const ModelConfig m = config_of(mixtral());
  EXPECT_EQ(unsupported_features(m, "llama,qwen3", "neox_rope,qk_norm"),
            "mixture-of-experts FFN (softmax top-k router)");
  EXPECT_EQ(unsupported_features(m, "llama", "moe"), "");
  EXPECT_NE(unsupported_features(config_of(qwen3moe()), "llama,qwen3", "neox_rope,qk_norm,moe")
                .find("architecture 'qwen3moe'"),
            std::string::npos);
  gg::testing::TempFile f(tiny_model(mixtral()), "plain");
  try {
    read_llama_config(gg::File::open(f.path()));
    ADD_FAILURE() << "Mixtral accepted by read_llama_config";
  } catch (const UnsupportedModel& e) {
    EXPECT_NE(std::string(e.what()).find("mixture-of-experts"), std::string::npos) << e.what();
  }
}

std::vector<std::vector<float>> run(const ModelWeights& w, const std::vector<int32_t>& tokens,
                                    int threads) {
  const StoredWeights stored = stored_view(w);
  ReferenceTransformer ref(stored, 64, threads);
  std::vector<std::vector<float>> out;
  for (int32_t t : tokens) {
    out.emplace_back(size_t(w.config.n_vocab));
    ref.forward(t, out.back());
  }
  return out;
}

ModelWeights load(const TinyOptions& o) {
  gg::testing::TempFile f(tiny_model(o), "moe_run");
  return load_model_weights(gg::File::open(f.path()));
}

const std::vector<int32_t> kTokens = {1, 7, 3, 30, 12, 5, 9, 2};

TEST(MoeReference, RunsAndIsDeterministicAcrossThreads) {
  for (const TinyOptions& o : {mixtral(), mixtral(8, 2), qwen3moe(), qwen3moe(0)}) {
    const ModelWeights w = load(o);
    const auto a = run(w, kTokens, 1), b = run(w, kTokens, 3);
    for (size_t p = 0; p < a.size(); ++p) {
      for (float v : a[p]) ASSERT_TRUE(std::isfinite(v)) << o.arch << " position " << p;
      EXPECT_EQ(a[p], b[p]) << o.arch << " position " << p << ": 1 vs 3 threads";
    }
  }
  // Renormalisation changes the result (the weights of 2 of 6 experts sum to < 1).
  EXPECT_NE(run(load(qwen3moe(0)), kTokens, 1), run(load(qwen3moe(1)), kTokens, 1));
  EXPECT_EQ(run(load(qwen3moe()), kTokens, 1), run(load(qwen3moe(1)), kTokens, 1));
}

// Every expert a copy of expert 0: with renormalised weights the MoE layer is expert 0's
// dense FFN (sum of the weights = 1), whatever the router picks; without, it is scaled
// by the selected probabilities' sum (< 1), so it differs.
TEST(MoeReference, IdenticalExpertsEqualTheDenseFfn) {
  for (int norm : {1, 0}) {
    ModelWeights moe = load(qwen3moe(norm));
    ModelWeights dense = load(qwen3moe(norm));
    const ModelConfig& c = moe.config;
    const size_t block = size_t(c.moe.n_ff_exp) * size_t(c.n_embd);
    for (size_t l = 0; l < moe.layers.size(); ++l) {
      LayerWeights& L = moe.layers[l];
      for (int32_t e = 1; e < c.moe.n_expert; ++e) {
        for (auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
          std::copy(v->begin(), v->begin() + long(block), v->begin() + long(e * block));
      }
      LayerWeights& D = dense.layers[l];
      D.w_gate.assign(L.gate_exps.begin(), L.gate_exps.begin() + long(block));
      D.w_up.assign(L.up_exps.begin(), L.up_exps.begin() + long(block));
      D.w_down.assign(L.down_exps.begin(), L.down_exps.begin() + long(block));
    }
    dense.config.moe = MoeConfig{};
    dense.config.n_ff = c.moe.n_ff_exp;
    const auto a = run(moe, kTokens, 1), b = run(dense, kTokens, 1);
    double max_diff = 0.0;
    for (size_t p = 0; p < a.size(); ++p)
      for (size_t i = 0; i < a[p].size(); ++i)
        max_diff = std::max(max_diff, double(std::fabs(a[p][i] - b[p][i])));
    if (norm)
      EXPECT_LT(max_diff, 1e-5);  // w0 + w1 = 1 up to fp64 rounding, then one fp32 rounding
    else
      EXPECT_GT(max_diff, 1e-2);
  }
}

}  // namespace
}  // namespace touchstone
