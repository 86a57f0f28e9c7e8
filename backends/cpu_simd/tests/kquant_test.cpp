// kquant_test.cpp - the quantized path on GGUF types without a dedicated kernel
// (Q4_K, Q6_K, Q5_0, F16, MXFP4, ...): the generic block kernel against fp64 dot
// products of the reference dequantization, and a tiny generated llama model
// whose matrices are K-quants, run on both weight paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_simd_backend.h"
#include "gguf_builder.h"
#include "kernels.h"
#include "random_blocks.h"
#include "touchstone/model/quant.h"

namespace {

namespace gg = touchstone::gguf;
using gg::TensorType;

using touchstone::cpu_simd::test::random_blocks;

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

class GenericBlocks : public ::testing::TestWithParam<TensorType> {};

TEST_P(GenericBlocks, MatchDequantizedReferenceAndAreTilingIndependent) {
  const TensorType t = GetParam();
  const gg::TypeTraits& tr = gg::type_traits(t);
  // 19 tokens: register tiles from fp32 panels (>= 8 tokens) plus token and row tails.
  const size_t n_in = 512, rows = 7, n_tok = 19;
  const size_t be = tr.block_size >= 32 ? tr.block_size : 32;
  const size_t bbytes = be / tr.block_size * tr.type_size, row_bytes = n_in / be * bbytes;
  const auto W = random_blocks(t, rows * n_in, 3);
  std::vector<float> Wf(rows * n_in);
  gg::dequantize_row(t, W.data(), Wf.data(), int64_t(rows * n_in));
  const auto X = random_vec(n_tok * n_in, 5);
  // Every Highway target compiled in and supported (Q5_0 forms its weights in
  // registers with target-specific lane counts).
  for (const auto& [bit, name] : touchstone::cpu_simd::hwy_targets()) {
    SCOPED_TRACE(name);
    touchstone::cpu_simd::force_hwy_target(bit);
    // the kernel's dequantization (vectors for Q4_K / Q6_K) is the reference's, bitwise
    std::vector<float> D(rows * n_in, NAN);
    touchstone::cpu_simd::dequantize_blocks(int(t), W.data(), D.data(), rows * n_in / be, be,
                                            bbytes);
    EXPECT_EQ(std::memcmp(D.data(), Wf.data(), D.size() * sizeof(float)), 0);
    std::vector<float> Y(n_tok * rows, NAN);
    touchstone::cpu_simd::gemm_blocks_f32(int(t), W.data(), row_bytes, be, bbytes, 0, rows,
                                          X.data(), n_in, n_tok, Y.data(), rows);
    for (size_t k = 0; k < n_tok; ++k) {
      for (size_t r = 0; r < rows; ++r) {
        double ref = 0, mag = 0;
        for (size_t i = 0; i < n_in; ++i) {
          ref += double{Wf[r * n_in + i]} * X[k * n_in + i];
          mag += std::fabs(double{Wf[r * n_in + i]} * X[k * n_in + i]);
        }
        EXPECT_NEAR(Y[k * rows + r], ref, 2e-6 * mag + 1e-7) << "row " << r << " tok " << k;
      }
    }
    // All tokens, row ranges that leave short row groups (tiles of 4 / 2 / 1
    // rows): bitwise the same numbers.
    for (auto [a, b] : {std::pair<size_t, size_t>{1, 4}, {0, 5}, {2, 7}}) {
      std::vector<float> ys(n_tok * rows, NAN);
      touchstone::cpu_simd::gemm_blocks_f32(int(t), W.data(), row_bytes, be, bbytes, a, b, X.data(),
                                            n_in, n_tok, ys.data(), rows);
      for (size_t k = 0; k < n_tok; ++k)
        for (size_t r = a; r < b; ++r)
          EXPECT_EQ(ys[k * rows + r], Y[k * rows + r]) << a << ".." << b;
    }
    // One token, a row subset: bitwise the same numbers.
    for (size_t k = 0; k < n_tok; ++k) {
      std::vector<float> y1(rows, NAN);
      touchstone::cpu_simd::gemm_blocks_f32(int(t), W.data(), row_bytes, be, bbytes, 2, 6,
                                            X.data() + k * n_in, n_in, 1, y1.data(), rows);
      for (size_t r = 2; r < 6; ++r) EXPECT_EQ(y1[r], Y[k * rows + r]);
    }
    // A few tokens (a batched decode step, below the panels' token count: Q4_K /
    // Q6_K / Q5_0 form their weights in registers there), every row: bitwise.
    for (size_t n : {2u, 5u, 7u}) {
      std::vector<float> yn(n * rows, NAN);
      touchstone::cpu_simd::gemm_blocks_f32(int(t), W.data(), row_bytes, be, bbytes, 0, rows,
                                            X.data() + 3 * n_in, n_in, n, yn.data(), rows);
      for (size_t k = 0; k < n; ++k)
        for (size_t r = 0; r < rows; ++r)
          EXPECT_EQ(yn[k * rows + r], Y[(k + 3) * rows + r]) << n << " tokens";
    }
  }
  touchstone::cpu_simd::force_hwy_target(0);
}

INSTANTIATE_TEST_SUITE_P(Types, GenericBlocks,
                         ::testing::Values(TensorType::Q4_K, TensorType::Q6_K, TensorType::Q5_K,
                                           TensorType::Q2_K, TensorType::Q5_0, TensorType::F16,
                                           TensorType::MXFP4),
                         [](const auto& pi) { return std::string(gg::type_name(pi.param)); });

// A 2-layer llama (n_embd 256, GQA 4/2 heads, n_ff 512, vocab 300) whose
// matrices are Q4_K (attention, gate/up) and Q6_K (down, LM head): the
// quantized path (generic kernel, blocks read in place) must reproduce the
// full-precision path (the reference's fp32 dequantization) to fp32 rounding.
TEST(KQuantModel, QuantizedPathMatchesFullPrecision) {
  using gg::ValueType;
  gg::testing::GgufBuilder g;
  const uint32_t d = 256, ff = 512, n_head = 4, n_kv = 2, L = 2, V = 300;
  g.key("general.architecture", ValueType::STRING).str("llama");
  auto u32 = [&](const char* k, uint32_t v) { g.key(k, ValueType::UINT32).put<uint32_t>(v); };
  u32("llama.block_count", L);
  u32("llama.embedding_length", d);
  u32("llama.feed_forward_length", ff);
  u32("llama.attention.head_count", n_head);
  u32("llama.attention.head_count_kv", n_kv);
  u32("llama.context_length", 128);
  u32("llama.vocab_size", V);
  g.key("llama.attention.layer_norm_rms_epsilon", ValueType::FLOAT32).put<float>(1e-5f);
  g.key("llama.rope.freq_base", ValueType::FLOAT32).put<float>(10000.0f);
  uint32_t seed = 10;
  auto mat = [&](const std::string& name, uint64_t n_in, uint64_t n_out, TensorType t) {
    g.tensor(name, {n_in, n_out}, t, random_blocks(t, n_in * n_out, seed++));
  };
  auto norm = [&](const std::string& name) {
    std::vector<uint8_t> b(d * 4);
    for (uint32_t i = 0; i < d; ++i) {
      const float v = 1.0f + 0.01f * float(i % 7);
      std::memcpy(b.data() + i * 4, &v, 4);
    }
    g.tensor(name, {d}, TensorType::F32, b);
  };
  mat("token_embd.weight", d, V, TensorType::Q6_K);
  for (uint32_t l = 0; l < L; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight");
    mat(b + "attn_q.weight", d, d, TensorType::Q4_K);
    mat(b + "attn_k.weight", d, d / n_head * n_kv, TensorType::Q4_K);
    mat(b + "attn_v.weight", d, d / n_head * n_kv, TensorType::Q4_K);
    mat(b + "attn_output.weight", d, d, TensorType::Q4_K);
    norm(b + "ffn_norm.weight");
    mat(b + "ffn_gate.weight", d, ff, TensorType::Q4_K);
    mat(b + "ffn_up.weight", d, ff, TensorType::Q4_K);
    mat(b + "ffn_down.weight", ff, d, TensorType::Q6_K);
  }
  norm("output_norm.weight");
  mat("output.weight", d, V, TensorType::Q6_K);
  gg::testing::TempFile file(g.build(), "kquant");

  const ts_backend* api = touchstone::cpu_simd::backend_table();
  ts_model* model = nullptr;
  ASSERT_EQ(api->load_model(file.path().c_str(), &model), TS_OK) << api->last_error();
  const std::vector<int32_t> tokens = {1, 17, 42, 299, 5, 123, 7, 250};
  const size_t n = tokens.size();
  std::vector<float> logits[2];
  for (int path = 0; path < 2; ++path) {
    ts_session_options o{};
    o.struct_size = sizeof(o);
    o.weight_path = path ? TS_WEIGHTS_QUANTIZED : TS_WEIGHTS_FULL_PRECISION;
    o.n_threads = 2;
    ts_session* s = nullptr;
    ASSERT_EQ(api->open_session(model, &o, &s), TS_OK) << api->last_error();
    logits[path].resize(n * V);
    ASSERT_EQ(api->prefill(s, tokens.data(), int32_t(n), 1, logits[path].data()), TS_OK)
        << api->last_error();
    api->free_session(s);
  }
  api->free_model(model);
  double num = 0, den = 0;
  for (size_t i = 0; i < n * V; ++i) {
    ASSERT_TRUE(std::isfinite(logits[1][i])) << i;
    num += (double{logits[0][i]} - logits[1][i]) * (double{logits[0][i]} - logits[1][i]);
    den += double{logits[0][i]} * logits[0][i];
  }
  EXPECT_GT(den, 0.0);
  EXPECT_LT(num / den, 1e-10) << "NMSE quantized vs full precision";
}

}  // namespace
