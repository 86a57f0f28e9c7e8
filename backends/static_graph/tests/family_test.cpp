// family_test.cpp - static_graph computes every family of ModelConfig like the reference.
//
// Tiny random GGUF models (model/core/tests/tiny_family.h: llama, qwen2, qwen3,
// gemma3, phi3, and variants with the optional features: rope_freqs, linear RoPE
// scaling, partial rotary, soft-capping, rope.freq_base_swa) run through the
// full-precision graphs and through the reference (ReferenceTransformer). The
// logits of every position must agree to fp32 accumulation noise for a prefill
// (buckets of 4 tokens, padded) and for token-by-token decode, and the layer taps
// of the last position (ABI v4) must agree with the reference's. Sliding windows
// are shorter than the sequence, so they matter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
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

using Case = touchstone::testing::FamilyVariant;
std::vector<Case> cases() { return touchstone::testing::family_variants(); }

// Reference logits of every position (one forward call per token) and the
// layer taps of the last one.
std::vector<float> reference_logits(const std::string& path, const std::vector<int32_t>& tokens,
                                    std::vector<float>& taps) {
  const touchstone::StoredWeights w = touchstone::load_stored_weights(path);
  touchstone::ReferenceTransformer ref(w, 64, 1);
  ref.set_taps(true);
  const size_t V = size_t(w.config.n_vocab);
  std::vector<float> out(tokens.size() * V);
  for (size_t i = 0; i < tokens.size(); ++i)
    ref.forward(tokens[i], std::span<float>(out.data() + i * V, V));
  taps = ref.taps();
  return out;
}

// NMSE of got against want, and the largest absolute difference.
std::pair<double, double> compare(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double{got[i]} - double{want[i]};
    num += e * e;
    den += double{want[i]} * double{want[i]};
    max_abs = std::max(max_abs, std::fabs(e));
  }
  return {den > 0 ? num / den : INFINITY, max_abs};
}

// Runs `run` on a session of every case's model and compares the logits of
// every position (and, when taps_too, the last position's layer taps) with the
// reference's. run: (session, tokens, logits of every position).
template <typename Run>
void expect_every_family_matches(const Run& run, bool taps_too) {
  const std::vector<int32_t> tokens = {1, 7, 3, 31, 0, 12, 12, 5, 20, 9, 2, 17};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    gg::testing::TempFile f(touchstone::testing::tiny_model(c.options), c.name);
    const touchstone::ModelConfig cfg = touchstone::read_model_config(gg::File::open(f.path()));
    const std::vector<std::string> names = cfg.feature_names();
    for (const std::string& want : c.features)
      EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    std::vector<float> ref_taps;
    const std::vector<float> ref = reference_logits(f.path(), tokens, ref_taps);
    auto model = sg::load_model(f.path());
    sg::GraphSession s(*model, sg::WeightMode::FullPrecision, 64, 1);
    s.set_taps(true);
    std::vector<float> got(ref.size());
    run(s, tokens, got);
    const auto [nmse, max_abs] = compare(got, ref);
    EXPECT_LT(nmse, 1e-11) << "NMSE vs reference";
    EXPECT_LT(max_abs, 1e-4) << "max |difference|";
    if (!taps_too) continue;
    // Taps of the last position: [n_layer][3][n_embd], the reference's layout.
    ASSERT_EQ(s.taps().size(), ref_taps.size());
    EXPECT_LT(compare(s.taps(), ref_taps).first, 1e-11) << "layer taps vs reference";
  }
}

// One prefill of 12 tokens in buckets of 4 (three calls of one graph).
TEST(StaticGraphFamilies, PrefillMatchesTheReference) {
  expect_every_family_matches(
      [](sg::GraphSession& s, const std::vector<int32_t>& t, std::vector<float>& out) {
        s.buckets.prefill = {4};
        s.prefill(t.data(), int32_t(t.size()), true, out.data());
      },
      true);
}

// Token-by-token decode (the T = 1 graph).
TEST(StaticGraphFamilies, DecodeMatchesTheReference) {
  expect_every_family_matches(
      [](sg::GraphSession& s, const std::vector<int32_t>& t, std::vector<float>& out) {
        const size_t V = out.size() / t.size();
        for (size_t i = 0; i < t.size(); ++i) s.decode(t[i], out.data() + i * V);
      },
      true);
}

// Recording taps does not change the logits (bitwise), and turning them off
// clears the record.
TEST(StaticGraphFamilies, TapsDoNotChangeLogits) {
  TinyOptions o;
  o.arch = "gemma3";
  o.n_layer = 7;
  o.sliding_window = 3;
  gg::testing::TempFile f(touchstone::testing::tiny_model(o), "taps");
  auto model = sg::load_model(f.path());
  const std::vector<int32_t> tokens = {1, 7, 3, 31, 0};
  const size_t V = size_t(model->dims.n_vocab);
  std::vector<float> with(V * tokens.size()), without(V * tokens.size());
  sg::GraphSession a(*model, sg::WeightMode::FullPrecision, 64, 1),
      b(*model, sg::WeightMode::FullPrecision, 64, 1);
  a.set_taps(true);
  a.prefill(tokens.data(), int32_t(tokens.size()), true, with.data());
  b.prefill(tokens.data(), int32_t(tokens.size()), true, without.data());
  EXPECT_EQ(with, without);
  EXPECT_EQ(a.taps().size(), size_t(model->dims.n_layer) * 3 * size_t(model->dims.n_embd));
  EXPECT_TRUE(b.taps().empty());
  a.set_taps(false);
  EXPECT_TRUE(a.taps().empty());
}

}  // namespace
