// moe_test.cpp - static_graph computes the mixture-of-experts families (Mixtral-style:
// llama + expert_count; Qwen3-MoE; Qwen2-MoE with its shared expert) like the
// reference (moe_feed_forward) on both paths:
//  * tiny random models (model/core/tests/tiny_family.h: F32 matrices) on the
//    full-precision graphs, prefill in buckets of 4 and token-by-token decode, logits
//    of every position and the last position's layer taps;
//  * converted test models (Qwen2-MoE's Q6_K file, gpt-oss's MXFP4 one: the experts
//    stacked in the graph's block layouts) on both paths, and the quantized path's
//    prefill == decode bitwise (the same sums per output in every graph).
//  * gpt-oss (attention sinks, YaRN, its router and clamped SwiGLU, MXFP4 experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"
#include "gguf_builder.h"
#include "tiny_family.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/reference_forward.h"

namespace {

namespace gg = touchstone::gguf;
namespace sg = touchstone::static_graph;
using touchstone::testing::TinyOptions;

const std::vector<int32_t> kTokens = {1, 7, 3, 31, 0, 12, 12, 5, 20, 9, 2, 17};

// Reference logits of every position (one forward call per token) and the layer taps
// of the last one.
std::vector<float> reference_logits(const std::string& path, std::vector<float>& taps) {
  const touchstone::StoredWeights w = touchstone::load_stored_weights(path);
  touchstone::ReferenceTransformer ref(w, 64, 1);
  ref.set_taps(true);
  const size_t V = size_t(w.config.n_vocab);
  std::vector<float> out(kTokens.size() * V);
  for (size_t i = 0; i < kTokens.size(); ++i)
    ref.forward(kTokens[i], std::span<float>(out.data() + i * V, V));
  taps = ref.taps();
  return out;
}

// NMSE of got against want.
double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double{got[i]} - double{want[i]};
    num += e * e;
    den += double{want[i]} * double{want[i]};
  }
  return den > 0 ? num / den : INFINITY;
}

// Logits of every position and the last position's taps: a prefill in buckets of 4
// (three calls of one graph), or decode steps (the T = 1 graph).
std::vector<float> run(sg::GraphModel& m, sg::WeightMode mode, bool prefill,
                       std::vector<float>& taps) {
  sg::GraphSession s(m, mode, 64, 1);
  s.set_taps(true);
  const size_t V = size_t(m.dims.n_vocab);
  std::vector<float> out(kTokens.size() * V);
  if (prefill) {
    s.buckets.prefill = {4};
    s.prefill(kTokens.data(), int32_t(kTokens.size()), true, out.data());
  } else {
    for (size_t i = 0; i < kTokens.size(); ++i) s.decode(kTokens[i], out.data() + i * V);
  }
  taps = s.taps();
  return out;
}

// Both ways of running (prefill, decode) on each weight path against the reference;
// the quantized path's prefill and decode give the same bits.
void check_against_reference(const std::string& path, const std::vector<sg::WeightMode>& modes,
                             double nmse_max) {
  std::vector<float> ref_taps, taps;
  const std::vector<float> ref = reference_logits(path, ref_taps);
  auto model = sg::load_model(path);
  ASSERT_GT(model->dims.n_expert, 0);
  for (sg::WeightMode mode : modes) {
    const bool quant = mode == sg::WeightMode::Quantized;
    SCOPED_TRACE(quant ? "quantized" : "full_precision");
    const std::vector<float> pre = run(*model, mode, true, taps);
    EXPECT_LT(nmse(pre, ref), nmse_max) << "prefill logits vs reference";
    ASSERT_EQ(taps.size(), ref_taps.size());
    EXPECT_LT(nmse(taps, ref_taps), nmse_max) << "prefill taps vs reference";
    const std::vector<float> dec = run(*model, mode, false, taps);
    EXPECT_LT(nmse(dec, ref), nmse_max) << "decode logits vs reference";
    EXPECT_LT(nmse(taps, ref_taps), nmse_max) << "decode taps vs reference";
    if (quant) {
      EXPECT_EQ(pre, dec) << "quantized prefill == decode";
    }
  }
}

// tiny_family.h moe_variants: Mixtral-style 4 experts top-2; Qwen3-MoE 8 experts top-3
// with its own expert width, renormalised and not.
TEST(StaticGraphMoe, TinyModelsMatchTheReference) {
  for (const auto& [name, o] : touchstone::testing::moe_variants()) {
    SCOPED_TRACE(name);
    gg::testing::TempFile f(touchstone::testing::tiny_model(o), "sg_moe_" + name);
    check_against_reference(f.path(), {sg::WeightMode::FullPrecision}, 1e-11);
  }
}

// The converted test models named by TOUCHSTONE_SG_MOE_MODELS (skipped when absent).
std::vector<std::string> file_cases(std::initializer_list<const char*> names) {
  std::vector<std::string> out;
  for (const char* n : names) {
    const std::string p = std::string(TOUCHSTONE_MOE_MODEL_DIR) + "/" + n + ".gguf";
    if (std::filesystem::exists(p)) out.push_back(p);
  }
  return out;
}

// GGUF blocks: Qwen2-MoE's Q6_K file (its shared expert, Q8_0 experts and Q6_K
// ffn_down_exps stacked); NMSE as cpu_simd's (quantized == full precision up to fp32
// summation order). CI time: the Mixtral-style and Qwen3-MoE files on both paths are
// testmodel.static_graph.* (slow), with every other MoE file.
TEST(StaticGraphMoe, TestModelsMatchTheReferenceOnBothPaths) {
  const std::vector<std::string> files = file_cases({"qwen2moe-test-q6_k"});
  if (files.empty()) GTEST_SKIP() << "no test models in " << TOUCHSTONE_MOE_MODEL_DIR;
  for (const std::string& p : files) {
    SCOPED_TRACE(p);
    check_against_reference(p, {sg::WeightMode::FullPrecision, sg::WeightMode::Quantized}, 1e-10);
  }
}

// gpt-oss (tests/models/gpt-oss): YaRN RoPE, attention sinks, attn_output.bias, the
// router's bias and top-k-then-softmax, expert biases, the clamped SwiGLU, 8-token sliding
// windows on every other layer (12 tokens cross them); MXFP4 experts as stored (Q8_0
// attention matrices beside them) on both paths.
TEST(StaticGraphMoe, GptOssMatchesTheReferenceOnBothPaths) {
  const std::string p = std::string(TOUCHSTONE_GPTOSS_MODEL_DIR) + "/gptoss-test-mxfp4.gguf";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << "no " << p;
  check_against_reference(p, {sg::WeightMode::FullPrecision, sg::WeightMode::Quantized}, 1e-10);
}

}  // namespace
