// moe_routing_test.cpp - the routing diagnosis (touchstone/run/moe_routing.h) on the
// tiny mixture-of-experts test models: the reference's own taps read back as its own
// routing, and backend taps made from another expert set or weighting (computed here
// by a plain fp64 implementation of the experts) read back as that set or weighting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/moe_router.h"
#include "touchstone/reference/reference_forward.h"
#include "touchstone/run/moe_routing.h"

namespace {

using touchstone::ModelWeights;

ModelWeights load(const std::string& name) {
  const std::string path = std::string(TOUCHSTONE_MOE_MODELS) + "/" + name;
  return touchstone::load_model_weights(touchstone::gguf::File::open(path));
}

// The reference's tap record after running `tokens` (its last token's taps).
std::vector<float> reference_taps(const ModelWeights& w, const std::vector<int32_t>& tokens) {
  const touchstone::StoredWeights stored = touchstone::stored_view(w);
  touchstone::ReferenceTransformer ref(stored, 64, 1);
  ref.set_taps(true);
  std::vector<float> logits(size_t(w.config.n_vocab));
  ref.prefill(tokens, false, logits);
  return ref.taps();
}

// Plain fp64 mixture of `experts` on the FFN input x of layer l (independent of the
// code under test): RMSNorm, softmax router, gated SiLU experts, weights renormalised
// over the set or not.
std::vector<float> mixture(const ModelWeights& w, int l, const std::vector<float>& x,
                           const std::vector<int32_t>& experts, bool renormalise) {
  const auto& c = w.config;
  const auto& L = w.layers[size_t(l)];
  const size_t d = size_t(c.n_embd), ff = size_t(c.moe.n_ff_exp), n = size_t(c.moe.n_expert);
  double ss = 0;
  for (float v : x) ss += double{v} * v;
  std::vector<double> h(d);
  for (size_t i = 0; i < d; ++i)
    h[i] = double{x[i]} / std::sqrt(ss / double(d) + c.rms_norm_eps) * L.ffn_norm[i];
  std::vector<double> z(n), p(n);
  double zmax = -1e300, zs = 0;
  for (size_t e = 0; e < n; ++e) {
    for (size_t i = 0; i < d; ++i) z[e] += double{L.ffn_gate_inp[e * d + i]} * h[i];
    zmax = std::max(zmax, z[e]);
  }
  for (size_t e = 0; e < n; ++e) zs += p[e] = std::exp(z[e] - zmax);
  double sel = 0;
  for (int32_t e : experts) sel += p[size_t(e)] / zs;
  std::vector<double> out(d, 0.0);
  for (int32_t e : experts) {
    const double wt = (p[size_t(e)] / zs) / (renormalise ? sel : 1.0);
    std::vector<double> a(ff);
    for (size_t j = 0; j < ff; ++j) {
      double g = 0, u = 0;
      for (size_t i = 0; i < d; ++i) {
        g += double{L.gate_exps[(size_t(e) * ff + j) * d + i]} * h[i];
        u += double{L.up_exps[(size_t(e) * ff + j) * d + i]} * h[i];
      }
      a[j] = g / (1 + std::exp(-g)) * u;
    }
    for (size_t i = 0; i < d; ++i) {
      double y = 0;
      for (size_t j = 0; j < ff; ++j) y += double{L.down_exps[(size_t(e) * d + i) * ff + j]} * a[j];
      out[i] += wt * y;
    }
  }
  return {out.begin(), out.end()};
}

// Layer l's FFN input from the record (l >= 1: residual of l - 1 plus attention of l).
std::vector<float> ffn_input(const std::vector<float>& rec, int l, size_t d) {
  std::vector<float> x(d);
  const size_t cur = size_t(l) * TS_TAP_POINTS * d, prev = cur - TS_TAP_POINTS * d;
  for (size_t i = 0; i < d; ++i)
    x[i] = float(double{rec[prev + TS_TAP_RESIDUAL * d + i]} + rec[cur + TS_TAP_ATTN_OUT * d + i]);
  return x;
}

// A backend record: the reference's, with layer l's FFN output (and residual) replaced.
std::vector<float> with_ffn(std::vector<float> rec, int l, const std::vector<float>& x,
                            const std::vector<float>& f) {
  const size_t d = x.size(), cur = size_t(l) * TS_TAP_POINTS * d;
  for (size_t i = 0; i < d; ++i) {
    rec[cur + TS_TAP_FFN_OUT * d + i] = f[i];
    rec[cur + TS_TAP_RESIDUAL * d + i] = float(double{x[i]} + f[i]);
  }
  return rec;
}

class MoeRouting : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeRouting, ReferenceTapsReadBackAsTheReferenceRouting) {
  const ModelWeights w = load(GetParam());
  const std::vector<float> rec = reference_taps(w, {1, 17, 42, 99, 7});
  for (int l = 0; l < w.config.n_layer; ++l) {
    const auto dg = touchstone::diagnose_routing(touchstone::stored_view(w), 0, l, rec, rec);
    ASSERT_TRUE(dg.has_value());
    EXPECT_FALSE(dg->routing_differs()) << dg->describe(0.1);
    EXPECT_FALSE(dg->weighting_differs()) << dg->describe(0.1);
    EXPECT_EQ(dg->reference.size(), size_t(w.config.moe.n_expert_used));
    // Its own mixture recomputed from its taps: to fp32 rounding (layer 0's input is
    // recovered as residual - FFN output, one more rounding).
    EXPECT_LT(dg->reference_mix.nmse, l == 0 ? 1e-10 : 1e-12) << dg->describe(0.1);
    EXPECT_GT(dg->margin, 0.0);
  }
}

TEST_P(MoeRouting, AnotherExpertSetIsNamedWithTheMargin) {
  const ModelWeights w = load(GetParam());
  const std::vector<float> rec = reference_taps(w, {3, 5, 8, 13});
  const size_t d = size_t(w.config.n_embd);
  const auto ref = touchstone::diagnose_routing(touchstone::stored_view(w), 2, 1, rec, rec);
  ASSERT_TRUE(ref && ref->runner_up >= 0);
  const std::vector<float> x = ffn_input(rec, 1, d);
  std::vector<int32_t> swapped = ref->reference;
  swapped.back() = ref->runner_up;  // the k-th expert replaced by the runner-up
  const std::vector<float> test = with_ffn(rec, 1, x, mixture(w, 1, x, swapped, true));
  const auto dg = touchstone::diagnose_routing(touchstone::stored_view(w), 2, 1, rec, test);
  ASSERT_TRUE(dg.has_value());
  EXPECT_TRUE(dg->routing_differs()) << dg->describe(0.1);
  std::vector<int32_t> got = dg->best.experts, want = swapped;
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want) << dg->describe(0.1);
  EXPECT_TRUE(dg->near_tie(dg->margin * 2)) << dg->describe(dg->margin * 2);
  EXPECT_FALSE(dg->near_tie(dg->margin / 2));
  EXPECT_NE(dg->describe(0.0).find("routing divergence at step 2, layer 1"), std::string::npos)
      << dg->describe(0.0);
  // Its first expert replaced instead: not the near-tie swap, whatever the margin.
  std::vector<int32_t> first = ref->reference;
  first.front() = ref->runner_up;
  const auto far = touchstone::diagnose_routing(touchstone::stored_view(w), 2, 1, rec,
                                                with_ffn(rec, 1, x, mixture(w, 1, x, first, true)));
  ASSERT_TRUE(far.has_value());
  EXPECT_TRUE(far->routing_differs()) << far->describe(1e9);
  EXPECT_FALSE(far->near_tie(1e9)) << far->describe(1e9);
}

TEST_P(MoeRouting, SkippedRenormalisationIsAWeightingDivergence) {
  const ModelWeights w = load(GetParam());
  ASSERT_TRUE(w.config.moe.norm_topk);
  const std::vector<float> rec = reference_taps(w, {11, 12});
  const size_t d = size_t(w.config.n_embd);
  const auto ref = touchstone::diagnose_routing(touchstone::stored_view(w), 0, 1, rec, rec);
  ASSERT_TRUE(ref.has_value());
  const std::vector<float> x = ffn_input(rec, 1, d);
  const auto dg =
      touchstone::diagnose_routing(touchstone::stored_view(w), 0, 1, rec,
                                   with_ffn(rec, 1, x, mixture(w, 1, x, ref->reference, false)));
  ASSERT_TRUE(dg.has_value());
  EXPECT_FALSE(dg->routing_differs()) << dg->describe(0.1);
  EXPECT_TRUE(dg->weighting_differs()) << dg->describe(0.1);
  EXPECT_FALSE(dg->best.renormalised);
}

// gpt-oss (router and expert biases, clamped SwiGLU, softmax over the top k): the
// reference's own taps read back as its own routing.
TEST(MoeRoutingGptOss, ReferenceTapsReadBackAsTheReferenceRouting) {
  const ModelWeights w = touchstone::load_model_weights(touchstone::gguf::File::open(
      std::string(TOUCHSTONE_MOE_MODELS) + "/../gpt-oss/gptoss-test-f32.gguf"));
  const std::vector<float> rec = reference_taps(w, {1, 17, 42, 99, 7});
  for (int l = 0; l < w.config.n_layer; ++l) {
    const auto dg = touchstone::diagnose_routing(touchstone::stored_view(w), 0, l, rec, rec);
    ASSERT_TRUE(dg.has_value());
    EXPECT_FALSE(dg->routing_differs() || dg->weighting_differs()) << dg->describe(0.1);
    EXPECT_LT(dg->reference_mix.nmse, l == 0 ? 1e-10 : 1e-12) << dg->describe(0.1);
  }
}

TEST(MoeRoutingDense, DenseModelsHaveNoDiagnosis) {
  ModelWeights w;
  w.config.n_layer = 1;
  w.config.n_embd = 4;
  const std::vector<float> rec(12, 0.0f);
  EXPECT_FALSE(
      touchstone::diagnose_routing(touchstone::stored_view(w), 0, 0, rec, rec).has_value());
}

INSTANTIATE_TEST_SUITE_P(Families, MoeRouting,
                         ::testing::Values("mixtral-test-f32.gguf", "qwen3moe-test-f32.gguf"),
                         [](const auto& pi) {
                           const std::string s = pi.param;
                           return s.substr(0, s.find('-'));
                         });

}  // namespace
