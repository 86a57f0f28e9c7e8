// family_test.cpp - cpu_simd computes every family of ModelConfig like the reference.
//
// Tiny random GGUF models (model/core/tests/tiny_family.h: llama, qwen2, qwen3,
// gemma3, phi3, and variants with its optional features: rope_freqs, linear RoPE
// scaling, partial rotary, soft-capping, rope.freq_base_swa) run through cpu_simd on both weight
// paths (F32 matrices are used in place on the quantized path) and through the reference
// (ReferenceTransformer); logits of every position must agree to fp32 accumulation
// noise for a prefill and for token-by-token decode, and results must be bitwise
// identical for 1 and 3 threads. Sliding windows are shorter than the
// sequence, so they matter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu_simd_backend.h"
#include "engine.h"
#include "tiny_family.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/reference_forward.h"
#include "touchstone/test_model.h"

namespace {

namespace gg = touchstone::gguf;
using gg::TensorType;
using gg::ValueType;

using Case = touchstone::testing::FamilyVariant;
std::vector<Case> cases() { return touchstone::testing::family_variants(); }

// Reference logits of every position (one forward call per token).
std::vector<float> reference_logits(const std::string& path, const std::vector<int32_t>& tokens) {
  const touchstone::StoredWeights w = touchstone::load_stored_weights(path);
  touchstone::ReferenceTransformer ref(w, 64, 1);
  const size_t V = size_t(w.config.n_vocab);
  std::vector<float> out(tokens.size() * V);
  for (size_t i = 0; i < tokens.size(); ++i)
    ref.forward(tokens[i], std::span<float>(out.data() + i * V, V));
  return out;
}

// cpu_simd logits of every position: one prefill (all positions), or decode steps.
std::vector<float> cpu_simd_logits(ts_model* model, ts_weight_path weight_path, int threads,
                                   const std::vector<int32_t>& tokens, bool prefill, size_t V) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  ts_session_options o{};
  o.struct_size = sizeof(o);
  o.weight_path = weight_path;
  o.n_threads = threads;
  o.max_context = 64;
  ts_session* s = nullptr;
  EXPECT_EQ(api->open_session(model, &o, &s), TS_OK) << api->last_error();
  std::vector<float> out(tokens.size() * V);
  if (!s) return out;
  if (prefill) {
    EXPECT_EQ(api->prefill(s, tokens.data(), int32_t(tokens.size()), 1, out.data()), TS_OK)
        << api->last_error();
  } else {
    for (size_t i = 0; i < tokens.size(); ++i)
      EXPECT_EQ(api->decode(s, tokens[i], out.data() + i * V), TS_OK) << api->last_error();
  }
  api->free_session(s);
  return out;
}

TEST(Families, EveryFamilyMatchesTheReferenceOnBothPaths) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  const std::vector<int32_t> tokens = {1, 7, 3, 31, 0, 12, 12, 5, 20, 9, 2, 17};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    gg::testing::TempFile f(touchstone::testing::tiny_model(c.options), c.name);
    const touchstone::ModelConfig cfg = touchstone::read_model_config(gg::File::open(f.path()));
    const std::vector<std::string> names = cfg.feature_names();
    for (const std::string& want : c.features)
      EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    const size_t V = size_t(cfg.n_vocab);
    const std::vector<float> ref = reference_logits(f.path(), tokens);

    ts_model* model = nullptr;
    ASSERT_EQ(api->load_model(f.path().c_str(), &model), TS_OK) << api->last_error();
    for (ts_weight_path path : {TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED}) {
      SCOPED_TRACE(path == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision");
      // One prefill (OpenBLAS sgemm for F32 matrices) and token-by-token decode
      // (Highway matvec): different fp32 summation orders, each within fp32
      // accumulation noise of the reference.
      const std::vector<float> got = cpu_simd_logits(model, path, 1, tokens, true, V);
      const std::vector<float> dec = cpu_simd_logits(model, path, 1, tokens, false, V);
      for (const std::vector<float>* x : {&got, &dec}) {
        double num = 0, den = 0, max_abs = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          ASSERT_TRUE(std::isfinite((*x)[i])) << i;
          const double e = double{(*x)[i]} - double{ref[i]};
          num += e * e;
          den += double{ref[i]} * double{ref[i]};
          max_abs = std::max(max_abs, std::fabs(e));
        }
        EXPECT_GT(den, 0.0);
        EXPECT_LT(num / den, 1e-11) << (x == &got ? "prefill" : "decode") << ": NMSE vs reference";
        EXPECT_LT(max_abs, 1e-4) << (x == &got ? "prefill" : "decode") << ": max |difference|";
      }
      // 3 threads == 1 thread, bitwise
      EXPECT_EQ(cpu_simd_logits(model, path, 3, tokens, true, V), got);
      EXPECT_EQ(cpu_simd_logits(model, path, 3, tokens, false, V), dec);
    }
    api->free_model(model);
  }
}

// step_batch on every family (sliding windows shorter than the sequences,
// soft-capping, QK-norm, biases, partial rotary, F32 matrices through the
// matvec): three sessions at positions 0, 5 and 2 advanced together (a chunk
// with all positions, a decode step, a chunk) == each session alone, bitwise
// on the quantized path (batch invariant: cpu_simd_backend.h).
TEST(Families, StepBatchEqualsEachSessionAloneOnEveryFamily) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  const std::vector<int32_t> prefix = {3, 1, 4, 1, 5};
  const std::vector<std::vector<int32_t>> step = {{9, 2, 6, 5}, {3}, {5, 8, 9, 7, 9, 3}};
  const std::vector<size_t> at = {0, 5, 2};
  const std::vector<bool> all = {true, false, true};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    gg::testing::TempFile f(touchstone::testing::tiny_model(c.options), c.name);
    ts_model* model = nullptr;
    ASSERT_EQ(api->load_model(f.path().c_str(), &model), TS_OK) << api->last_error();
    const size_t V = size_t(api->n_vocab(model));
    std::vector<std::vector<float>> batched(3), alone(3);
    std::vector<ts_batch_entry> e(3);
    std::vector<ts_session*> s(6);
    for (size_t k = 0; k < 6; ++k) {
      ts_session_options o{};
      o.struct_size = sizeof(o);
      o.weight_path = TS_WEIGHTS_QUANTIZED;
      o.n_threads = 2;
      o.max_context = 64;
      ASSERT_EQ(api->open_session(model, &o, &s[k]), TS_OK) << api->last_error();
      std::vector<float> scratch(V);
      if (at[k % 3] > 0) {
        ASSERT_EQ(api->prefill(s[k], prefix.data(), int32_t(at[k % 3]), 0, scratch.data()), TS_OK);
      }
    }
    for (size_t k = 0; k < 3; ++k) {
      const auto& t = step[k];
      batched[k].resize((all[k] ? t.size() : 1) * V);
      alone[k].resize(batched[k].size());
      e[k] = {sizeof(ts_batch_entry), s[k], t.data(), int32_t(t.size()), int32_t(all[k]),
              batched[k].data()};
      ASSERT_EQ(
          api->prefill(s[k + 3], t.data(), int32_t(t.size()), int32_t(all[k]), alone[k].data()),
          TS_OK);
    }
    ASSERT_EQ(api->step_batch(e.data(), 3), TS_OK) << api->last_error();
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(batched[k], alone[k]) << "entry " << k;
    for (ts_session* x : s) api->free_session(x);
    api->free_model(model);
  }
}

// A sliding window changes the result only once the sequence is longer than the
// window (guards against a window that is silently ignored).
TEST(Families, SlidingWindowForgetsOldTokens) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  touchstone::testing::TinyOptions v;
  v.arch = "llama";
  v.n_layer = 1;  // one layer: the receptive field is exactly the window
  v.sliding_window = 3;
  gg::testing::TempFile f(touchstone::testing::tiny_model(v), "window");
  ts_model* model = nullptr;
  ASSERT_EQ(api->load_model(f.path().c_str(), &model), TS_OK) << api->last_error();
  const size_t V = 32;
  const std::vector<float> a =
      cpu_simd_logits(model, TS_WEIGHTS_QUANTIZED, 1, {1, 2, 3, 4, 5, 6}, true, V);
  const std::vector<float> b =
      cpu_simd_logits(model, TS_WEIGHTS_QUANTIZED, 1, {9, 8, 3, 4, 5, 6}, true, V);
  api->free_model(model);
  // position 1 still sees the changed tokens; position 5 attends to 3..5 only
  EXPECT_NE(std::vector<float>(a.begin() + V, a.begin() + 2 * V),
            std::vector<float>(b.begin() + V, b.begin() + 2 * V));
  EXPECT_EQ(std::vector<float>(a.begin() + 5 * V, a.end()),
            std::vector<float>(b.begin() + 5 * V, b.end()));
}

// The ABI v3 table declares exactly the engine's lists, and every declared feature
// is a canonical ModelConfig feature name: all 24 of model_config.cpp's table (the
// gpt-oss ones and qwen2moe's shared expert included).
TEST(Families, DeclaredFeaturesAreCanonicalNames) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  EXPECT_STREQ(api->architectures, touchstone::cpu_simd::kArchitectures);
  EXPECT_STREQ(api->model_features, touchstone::cpu_simd::kModelFeatures);
  std::string list = std::string(touchstone::cpu_simd::kModelFeatures) + ",";
  size_t n = 0;
  for (size_t p = 0, q; (q = list.find(',', p)) != std::string::npos; p = q + 1, ++n) {
    const std::string name = list.substr(p, q - p);
    EXPECT_NE(touchstone::feature_description(name), name) << name << " is not a feature name";
  }
  EXPECT_EQ(n, 24u);
}

// Gemma 3 270M Q4_K_M (skipped when absent): 521 tokens cross the 512-token
// sliding window of the local layers and the 128-token prefill chunks. Quantized:
// a 521-token prefill (1 thread) equals a 520-token prefill plus one decode step
// (2 threads) and a 3-thread prefill, bitwise. Full precision: 1 and 3 threads
// give the same bits.
TEST(Families, Gemma3RealModelPrefillDecodeAndThreads) {
  const std::string path =
      std::filesystem::path(touchstone::test::real_model_path()).parent_path() /
      "gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  ts_model* model = nullptr;
  ASSERT_EQ(api->load_model(path.c_str(), &model), TS_OK) << api->last_error();
  const size_t V = size_t(api->n_vocab(model)), N = 521;
  std::vector<int32_t> tok(N);
  for (size_t i = 0; i < N; ++i) tok[i] = int32_t((i * 7919 + 17) % 262144);
  auto run = [&](ts_weight_path w, int threads, bool split) {
    ts_session_options o{};
    o.struct_size = sizeof(o);
    o.weight_path = w;
    o.n_threads = threads;
    o.max_context = 600;
    ts_session* s = nullptr;
    EXPECT_EQ(api->open_session(model, &o, &s), TS_OK) << api->last_error();
    std::vector<float> l(V);
    if (!s) return l;
    if (split) {
      EXPECT_EQ(api->prefill(s, tok.data(), int32_t(N - 1), 0, l.data()), TS_OK);
      EXPECT_EQ(api->decode(s, tok[N - 1], l.data()), TS_OK);
    } else {
      EXPECT_EQ(api->prefill(s, tok.data(), int32_t(N), 0, l.data()), TS_OK);
    }
    api->free_session(s);
    return l;
  };
  const std::vector<float> q1 = run(TS_WEIGHTS_QUANTIZED, 1, false);
  for (float x : q1) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(run(TS_WEIGHTS_QUANTIZED, 2, true), q1) << "prefill + decode, 2 threads";
  EXPECT_EQ(run(TS_WEIGHTS_QUANTIZED, 3, false), q1) << "3 threads";
  const std::vector<float> f1 = run(TS_WEIGHTS_FULL_PRECISION, 1, false);
  EXPECT_EQ(run(TS_WEIGHTS_FULL_PRECISION, 3, false), f1) << "full precision, 3 threads";
  api->free_model(model);
}

}  // namespace
