// cpu_simd_test.cpp - unit tests of the cpu_simd backend:
//  * kernels vs scalar references, on every compiled and supported target
//    (Highway fp32 targets; quantized levels scalar / AVX2 / AVX-512 VNNI);
//  * on the real model (skipped when absent): prefill vs decode consistency,
//    rewind, determinism across runs and thread counts, for both weight paths.
#include <gtest/gtest.h>

#include "touchstone/test_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cpu_simd_backend.h"
#include "kernels.h"
#include "random_blocks.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"

namespace {

namespace gg = touchstone::gguf;
using namespace touchstone::cpu_simd;

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double dot_ref(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double{a[i]} * double{b[i]};
  return s;
}

// TOUCHSTONE_CPU_SIMD_TARGET (the cpu_simd.unit.<T> CTests) is applied before
// main, so the suites below enumerate hwy_targets() / qlevel_best() under it.
// A target this build lacks fails the run; one this CPU lacks skips it (77).
[[maybe_unused]] const bool kIsaSelected = [] {
  const IsaSelection& sel = select_isa_from_env();
  if (sel.status == IsaSelection::Ok) return true;
  std::fprintf(stderr, "%s\n", sel.message.c_str());
  std::exit(sel.status == IsaSelection::NotRunnable ? 77 : 1);
}();

// ---------------------------------------------------------------- fp32 (Highway)
class HwyTargets : public ::testing::TestWithParam<std::pair<int64_t, std::string>> {
 protected:
  void SetUp() override { force_hwy_target(GetParam().first); }
  void TearDown() override { force_hwy_target(0); }
};

TEST_P(HwyTargets, DotMatvecAxpyMatchFp64Reference) {
  ASSERT_EQ(hwy_current_target(), GetParam().second);
  for (size_t n : {1u, 7u, 16u, 64u, 100u, 576u, 1536u}) {
    const auto a = random_vec(n, 1), b = random_vec(n, 2);
    const double ref = dot_ref(a.data(), b.data(), n);
    double mag = 0;
    for (size_t i = 0; i < n; ++i) mag += std::fabs(double{a[i]} * b[i]);
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref, 1e-6 * mag + 1e-6) << "n=" << n;

    const size_t rows = 5;
    const auto W = random_vec(rows * n, 3);
    std::vector<float> y(rows);
    matvec_f32(W.data(), n, a.data(), y.data(), rows, n);
    for (size_t r = 0; r < rows; ++r) EXPECT_EQ(y[r], dot_f32(W.data() + r * n, a.data(), n));

    std::vector<float> acc = b;
    axpy_f32(0.5f, a.data(), acc.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(acc[i], b[i] + 0.5f * a[i]);
    scale_f32(2.0f, acc.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(acc[i], 2.0f * (b[i] + 0.5f * a[i]));
  }
}

// attend_f32 against softmax attention in fp64 (std::exp) over the KV-cache
// layout (rows of stride ld, the head at an offset), for lengths around the
// vector width (tail handling) and long contexts; a NaN score reaches every
// output; a head's result does not depend on the other heads in the rows.
TEST_P(HwyTargets, AttentionMatchesFp64Softmax) {
  ASSERT_EQ(hwy_current_target(), GetParam().second);
  const size_t hd = 64, ld = 3 * hd, off = hd;
  for (size_t n_kv : {1u, 2u, 7u, 15u, 16u, 17u, 33u, 200u, 1030u}) {
    const auto q = random_vec(hd, 11, 2.0f);
    const auto K = random_vec(n_kv * ld, 12), V = random_vec(n_kv * ld, 13);
    const float scale = 0.125f;
    std::vector<float> scores(n_kv), out(hd);
    attend_f32(q.data(), K.data() + off, V.data() + off, ld, hd, n_kv, scale, scores.data(),
               out.data());
    std::vector<double> p(n_kv);
    double mx = -1e300, sum = 0;
    for (size_t t = 0; t < n_kv; ++t) {
      p[t] = dot_ref(q.data(), K.data() + t * ld + off, hd) * scale;
      mx = std::max(mx, p[t]);
    }
    for (auto& x : p) sum += (x = std::exp(x - mx));
    for (size_t j = 0; j < hd; ++j) {
      double ref = 0, mag = 0;
      for (size_t t = 0; t < n_kv; ++t) {
        ref += p[t] * V[t * ld + off + j];
        mag += std::fabs(p[t] * V[t * ld + off + j]);
      }
      EXPECT_NEAR(out[j], ref / sum, 1e-5 * (mag / sum) + 1e-6) << "n_kv=" << n_kv << " j=" << j;
    }
    // other heads' columns changed: same bits for this head
    auto K2 = K, V2 = V;
    for (size_t t = 0; t < n_kv; ++t) K2[t * ld] = V2[t * ld + 2 * hd] = 1e30f;
    std::vector<float> out2(hd);
    attend_f32(q.data(), K2.data() + off, V2.data() + off, ld, hd, n_kv, scale, scores.data(),
               out2.data());
    EXPECT_EQ(out, out2) << "n_kv=" << n_kv;
  }
  // a NaN in one cached key poisons the head's output (as std::exp would)
  const size_t n_kv = 20;
  const auto q = random_vec(hd, 21);
  auto K = random_vec(n_kv * hd, 22);
  const auto V = random_vec(n_kv * hd, 23);
  K[5 * hd + 3] = NAN;
  std::vector<float> scores(n_kv), out(hd);
  attend_f32(q.data(), K.data(), V.data(), hd, hd, n_kv, 0.125f, scores.data(), out.data());
  for (float x : out) EXPECT_TRUE(std::isnan(x));
}

// attend_multi_f32 == G separate attend_f32 calls, bit for bit: GQA groups
// (same rows), prefill blocks (causal ends differ), sliding windows (starts
// differ, some ranges disjoint); head dims with and without a vector tail; a
// NaN score in one query leaves the others' bits alone.
TEST_P(HwyTargets, MultiQueryAttentionEqualsPerQueryBits) {
  ASSERT_EQ(hwy_current_target(), GetParam().second);
  for (size_t hd : {64u, 256u, 72u, 40u}) {
    for (size_t n_kv : {1u, 5u, 37u, 300u}) {
      const size_t ld = 2 * hd, off = hd, max_g = 13;
      const auto Q = random_vec(max_g * hd, 31, 2.0f);
      auto K = random_vec((n_kv + max_g) * ld, 32), V = random_vec((n_kv + max_g) * ld, 33);
      for (size_t G : {1u, 2u, 3u, 4u, 5u, 8u, 13u}) {
        for (int shape = 0; shape < 4; ++shape) {
          // 0: one range; 1: causal ends n_kv + g/3; 2: windows (starts g, ends
          // n_kv + g); 3: as 0 with a NaN key row seen by query 1 only
          std::vector<size_t> t0(G), t1(G);
          for (size_t g = 0; g < G; ++g) {
            t0[g] = shape == 2 ? g : 0;
            t1[g] = n_kv + (shape == 1 ? g / 3 : shape == 2 ? g : 0);
          }
          auto K2 = K;
          if (shape == 3 && G > 1) {  // query 1 attends one extra row, holding a NaN
            t1[1] = n_kv + 1;
            K2[n_kv * ld + off + 1] = NAN;
          }
          std::vector<const float*> q(G);
          std::vector<float*> out(G);
          std::vector<float> got(G * hd, 1.0f), want(G * hd, 2.0f), scores(G * (n_kv + max_g));
          for (size_t g = 0; g < G; ++g) {
            q[g] = Q.data() + g * hd;
            out[g] = got.data() + g * hd;
            std::vector<float> s1(t1[g] - t0[g]);
            attend_f32(q[g], K2.data() + off + t0[g] * ld, V.data() + off + t0[g] * ld, ld, hd,
                       t1[g] - t0[g], 0.125f, s1.data(), want.data() + g * hd);
          }
          attend_multi_f32(G, q.data(), K2.data() + off, V.data() + off, ld, hd, t0.data(),
                           t1.data(), 0.125f, scores.data(), n_kv + max_g, out.data());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), G * hd * sizeof(float)), 0)
              << "hd=" << hd << " n_kv=" << n_kv << " G=" << G << " shape=" << shape;
          if (shape == 3 && G > 1) {
            EXPECT_TRUE(std::isnan(got[hd]));
          }
        }
      }
    }
  }
}

std::vector<uint8_t> random_blocks(QType t, size_t n_rows, size_t n_in, uint32_t seed);

// Blocks dequantized in registers x fp32 activations vs fp64 dot products of
// touchstone::gguf::dequantize_row's weights; any row range / token subset gives
// the same bits.
TEST_P(HwyTargets, QuantBlocksTimesFp32MatchDequantizedReference) {
  for (QType t : {QType::Q4_0, QType::Q4_1, QType::Q8_0}) {
    const size_t n_in = 96, rows = 5, n_tok = 11, nb = n_in / 32;
    const auto W = random_blocks(t, rows, n_in, 5);
    std::vector<float> Wf(rows * n_in);
    gg::dequantize_row(gg::TensorType(int(t)), W.data(), Wf.data(), int64_t(rows * n_in));
    const auto X = random_vec(n_tok * n_in, 9);
    const size_t row_bytes = nb * qtype_block_bytes(t);
    // The prefill panels' dequantization (vectors) is the reference's, bitwise.
    std::vector<float> D(rows * n_in, NAN);
    dequantize_blocks(int(t), W.data(), D.data(), rows * nb, 32, qtype_block_bytes(t));
    EXPECT_EQ(std::memcmp(D.data(), Wf.data(), D.size() * sizeof(float)), 0) << int(t);
    // 11 tokens: fp32 panels (>= 8 tokens, prefill) against QTile (1 token, decode) below.
    std::vector<float> Y(n_tok * rows, NAN), y1(rows, NAN);
    gemm_q_f32(t, W.data(), row_bytes, nb, 0, rows, X.data(), n_in, n_tok, Y.data(), rows);
    for (size_t k = 0; k < n_tok; ++k) {
      gemm_q_f32(t, W.data(), row_bytes, nb, 1, 4, X.data() + k * n_in, n_in, 1, y1.data(), rows);
      for (size_t r = 0; r < rows; ++r) {
        const double ref = dot_ref(Wf.data() + r * n_in, X.data() + k * n_in, n_in);
        double mag = 0;
        for (size_t i = 0; i < n_in; ++i)
          mag += std::fabs(double{Wf[r * n_in + i]} * X[k * n_in + i]);
        EXPECT_NEAR(Y[k * rows + r], ref, 1e-6 * mag + 1e-7)
            << int(t) << " row " << r << " tok " << k;
        if (r >= 1 && r < 4) {
          EXPECT_EQ(y1[r], Y[k * rows + r]);
        }
      }
    }
  }
}

// The FFN's gated activation (fp64 vector tanh / exp) against the reference's
// scalar formula (touchstone::ops: std::tanh / std::exp): equal, or 1 fp32 ulp
// apart in a tiny fraction of elements (GELU's saturated tail: 1e-14 |x u|); inf / NaN / huge
// inputs exactly as the reference; every element's bits independent of the call's length and
// offset.
TEST_P(HwyTargets, GatedActivationMatchesReferenceFormula) {
  for (bool gelu : {true, false}) {
    SCOPED_TRACE(gelu ? "GELU" : "SiLU");
    auto g = random_vec(20011, 21, 3.0f);
    const auto u = random_vec(20011, 22);
    g[5] = INFINITY, g[6] = -INFINITY, g[7] = NAN, g[8] = 800.0f, g[9] = -800.0f, g[10] = 0.0f;
    std::vector<float> ref(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = g[i];
      const double act = gelu ? touchstone::ops::gelu_tanh(x) : touchstone::ops::silu(x);
      ref[i] = static_cast<float>(act * double{u[i]});
    }
    std::vector<float> got = g;
    gated_act_f64(gelu, got.data(), u.data(), got.size());
    size_t diff = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::isnan(ref[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
        continue;
      }
      if (got[i] == ref[i]) continue;
      // GELU below x ~ -7: 1 + tanh(...) cancels to below the fp64 ulp of 1 (the
      // reference's own value there is rounding noise of ~1e-16 |x u|).
      const double scale = std::fabs(double{g[i]} * double{u[i]});
      if (gelu && g[i] < -7.0f && std::fabs(double{got[i]} - ref[i]) <= 1e-14 * scale) continue;
      ++diff;
      EXPECT_LE(std::fabs(got[i] - ref[i]),
                std::fabs(std::nextafter(ref[i], 0.0f) - ref[i]) * 1.01f)
          << "element " << i << " x=" << g[i];
    }
    EXPECT_LE(diff, 3u) << "elements 1 ulp from the reference";
    for (size_t off : {1u, 3u, 77u}) {  // other offsets and lengths: the same bits
      std::vector<float> part(g.begin() + off, g.begin() + off + 1000);
      gated_act_f64(gelu, part.data(), u.data() + off, part.size());
      EXPECT_EQ(std::memcmp(part.data(), got.data() + off, part.size() * sizeof(float)), 0) << off;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, HwyTargets, ::testing::ValuesIn(hwy_targets()),
                         [](const auto& pi) { return pi.param.second; });

// ---------------------------------------------------------------- quantized
// Random GGUF blocks of a type, generated through the fp16 bit patterns.
std::vector<uint8_t> random_blocks(QType t, size_t n_rows, size_t n_in, uint32_t seed) {
  return test::random_blocks(int(t), n_rows, n_in / 32, seed);
}

struct QCase {
  QLevel level;
  QType type;
};

std::vector<QCase> qcases() {
  std::vector<QCase> out;
  for (int l = 0; l <= int(qlevel_best()); ++l)
    for (QType t : {QType::Q4_0, QType::Q4_1, QType::Q8_0}) out.push_back({QLevel(l), t});
  return out;
}

class QuantKernels : public ::testing::TestWithParam<QCase> {
 protected:
  void SetUp() override { force_qlevel(GetParam().level); }
  void TearDown() override { force_qlevel(qlevel_best()); }
};

// Against fp64 dot products of the dequantized weights (touchstone::gguf::dequantize_row)
// and the dequantized int8 activations: the only error is fp32 accumulation.
TEST_P(QuantKernels, GemmMatchesDequantizedReferenceAndIsTilingIndependent) {
  const QType t = GetParam().type;
  for (size_t n_in : {32u, 64u, 96u, 576u}) {
    const size_t rows = 13, n_tok = 7, nb = n_in / 32;
    const auto W = random_blocks(t, rows, n_in, uint32_t(n_in));
    std::vector<float> Wf(rows * n_in);
    gg::dequantize_row(gg::TensorType(int(t)), W.data(), Wf.data(), int64_t(rows * n_in));
    std::vector<int8_t> qs(n_tok * n_in);
    std::vector<float> d(n_tok * nb), s(n_tok * nb);
    std::vector<ActRow> X(n_tok);
    const auto x = random_vec(n_tok * n_in, 7);
    for (size_t k = 0; k < n_tok; ++k) {
      X[k] = ActRow{qs.data() + k * n_in, d.data() + k * nb, s.data() + k * nb};
      quantize_act(x.data() + k * n_in, n_in, X[k]);
    }
    const size_t row_bytes = nb * qtype_block_bytes(t);
    std::vector<float> Y(n_tok * rows, NAN);
    gemm_q(t, W.data(), row_bytes, nb, 0, rows, X.data(), n_tok, Y.data(), rows);
    for (size_t k = 0; k < n_tok; ++k) {
      std::vector<float> xa(n_in);
      for (size_t i = 0; i < n_in; ++i) xa[i] = X[k].d[i / 32] * float(X[k].qs[i]);
      for (size_t r = 0; r < rows; ++r) {
        const double ref = dot_ref(Wf.data() + r * n_in, xa.data(), n_in);
        double mag = 0;
        for (size_t i = 0; i < n_in; ++i) mag += std::fabs(double{Wf[r * n_in + i]} * xa[i]);
        EXPECT_NEAR(Y[k * rows + r], ref, 2e-6 * mag + 1e-6)
            << "n_in=" << n_in << " row " << r << " tok " << k;
      }
    }
    // Any row range / token subset gives bitwise the same numbers (tiling independence:
    // the basis of prefill == decode and of thread-count determinism).
    for (size_t k = 0; k < n_tok; ++k) {
      std::vector<float> y1(rows, NAN);
      gemm_q(t, W.data(), row_bytes, nb, 3, 11, X.data() + k, 1, y1.data(), rows);
      for (size_t r = 3; r < 11; ++r) EXPECT_EQ(y1[r], Y[k * rows + r]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, QuantKernels, ::testing::ValuesIn(qcases()),
                         [](const auto& pi) {
                           const char* ty = pi.param.type == QType::Q4_0   ? "Q4_0"
                                            : pi.param.type == QType::Q4_1 ? "Q4_1"
                                                                           : "Q8_0";
                           return std::string(qlevel_name(pi.param.level)) + "_" + ty;
                         });

// Every int8 level quantizes to the same bits (scalar nearbyint, AVX2 and
// AVX-512 vcvtps2dq: round half to even), including an all-zero block, exact
// halves and a block whose maximum is negative.
TEST(QuantizeAct, EveryLevelGivesTheSameBits) {
  auto x = random_vec(32 * 7, 12, 2.0f);
  for (size_t i = 32; i < 64; ++i) x[i] = 0.0f;
  for (size_t i = 64; i < 96; ++i) x[i] = (float(i % 9) - 4.0f) * 0.5f * (127.0f / 4.0f) / 127.0f;
  x[100] = -50.0f;
  std::vector<int8_t> ref_qs(x.size()), qs(x.size());
  std::vector<float> ref_d(7), ref_s(7), d(7), sm(7);
  force_qlevel(QLevel::Scalar);
  quantize_act(x.data(), x.size(), ActRow{ref_qs.data(), ref_d.data(), ref_s.data()});
  for (int l = 1; l <= int(qlevel_best()); ++l) {
    force_qlevel(QLevel(l));
    quantize_act(x.data(), x.size(), ActRow{qs.data(), d.data(), sm.data()});
    EXPECT_EQ(qs, ref_qs) << qlevel_name(QLevel(l));
    EXPECT_EQ(std::memcmp(d.data(), ref_d.data(), 7 * sizeof(float)), 0) << qlevel_name(QLevel(l));
    EXPECT_EQ(std::memcmp(sm.data(), ref_s.data(), 7 * sizeof(float)), 0) << qlevel_name(QLevel(l));
  }
  force_qlevel(qlevel_best());
}

// Which targets the kernel suites above ran: HwyTargets (fp32 kernels, Q4_0 /
// Q4_1 / Q8_0 x fp32) and GenericBlocks (kquant_test.cpp: Q4_K, Q6_K, Q5_K,
// Q2_K, Q5_0, F16 x fp32) take every Highway target of hwy_targets(), QuantKernels
// (int8 activations) every level up to qlevel_best(). Printed, recorded as test
// properties, and, unless TOUCHSTONE_CPU_SIMD_TARGET restricts them, checked to
// be every compiled target this CPU runs and its best int8 level.
TEST(KernelCoverage, EveryTargetThisCpuRunsIsTested) {
  std::vector<std::string> tested;
  std::string ran, levels;
  for (const auto& [bit, name] : hwy_targets()) {
    tested.push_back(name);
    ran += " " + name;
  }
  for (int l = 0; l <= int(qlevel_best()); ++l) levels += std::string(" ") + qlevel_name(QLevel(l));
  std::printf("[ targets  ] Highway:%s; int8 levels:%s%s\n", ran.c_str(), levels.c_str(),
              select_isa_from_env().forced.empty() ? "" : " (TOUCHSTONE_CPU_SIMD_TARGET)");
  RecordProperty("hwy_targets", ran);
  RecordProperty("int8_levels", levels);
  if (!select_isa_from_env().forced.empty()) return;
  for (const IsaTarget& t : compiled_hwy_targets()) {
    const bool in = std::find(tested.begin(), tested.end(), t.name) != tested.end();
    EXPECT_EQ(in, t.runnable) << t.name;
  }
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_GE(int(qlevel_best()), int(QLevel::AVX2));
  }
}

TEST(QuantizeAct, RoundTripWithinHalfStep) {
  const auto x = random_vec(96, 11, 3.0f);
  int8_t qs[96];
  float d[3], s[3];
  quantize_act(x.data(), 96, ActRow{qs, d, s});
  for (size_t b = 0; b < 3; ++b) {
    int sum = 0;
    for (size_t i = 0; i < 32; ++i) {
      EXPECT_LE(std::fabs(d[b] * qs[b * 32 + i] - x[b * 32 + i]), 0.5f * d[b] * 1.0001f);
      sum += qs[b * 32 + i];
    }
    EXPECT_FLOAT_EQ(s[b], d[b] * float(sum));
  }
}

// ---------------------------------------------------------------- real model
std::string model_path() { return touchstone::test::real_model_path(); }

class ModelTest : public ::testing::TestWithParam<ts_weight_path> {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    api_ = backend_table();
    ASSERT_EQ(api_->load_model(model_path().c_str(), &model_), TS_OK) << api_->last_error();
    n_vocab_ = api_->n_vocab(model_);
  }
  static void TearDownTestSuite() {
    if (model_) api_->free_model(model_);
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_path();
  }
  ts_session* open(int threads, int32_t max_ctx = 512) {
    ts_session_options o{};
    o.struct_size = sizeof(o);
    o.weight_path = GetParam();
    o.n_threads = threads;
    o.max_context = max_ctx;
    ts_session* s = nullptr;
    EXPECT_EQ(api_->open_session(model_, &o, &s), TS_OK) << api_->last_error();
    return s;
  }
  static std::vector<int32_t> tokens(size_t n) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + 17) % 49152);
    return t;
  }
  static inline const ts_backend* api_ = nullptr;
  static inline ts_model* model_ = nullptr;
  static inline int32_t n_vocab_ = 0;
};

double nmse(const float* ref, const float* x, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double{ref[i]} - x[i]) * (double{ref[i]} - x[i]);
    den += double{ref[i]} * ref[i];
  }
  return num / den;
}

// Prefill of N tokens (all positions) vs N decode steps. Quantized path: bitwise
// equal (the kernels are tiling-independent and attention is computed per
// query). Full precision: prefill uses OpenBLAS sgemm, decode the Highway
// matvec (different fp32 summation orders): NMSE <= 1e-9 per position and the
// same argmax.
TEST_P(ModelTest, PrefillMatchesDecodeSteps) {
  const size_t N = 40, V = size_t(n_vocab_);
  const auto tok = tokens(N);
  ts_session* a = open(2);
  ts_session* b = open(2);
  std::vector<float> all(N * V), one(V);
  ASSERT_EQ(api_->prefill(a, tok.data(), int32_t(N), 1, all.data()), TS_OK) << api_->last_error();
  double worst = 0;
  for (size_t i = 0; i < N; ++i) {
    ASSERT_EQ(api_->decode(b, tok[i], one.data()), TS_OK);
    const float* row = all.data() + i * V;
    if (GetParam() == TS_WEIGHTS_QUANTIZED) {
      ASSERT_EQ(std::memcmp(row, one.data(), V * sizeof(float)), 0) << "position " << i;
    } else {
      worst = std::max(worst, nmse(one.data(), row, V));
      ASSERT_EQ(std::max_element(row, row + V) - row,
                std::max_element(one.begin(), one.end()) - one.begin());
    }
  }
  EXPECT_LE(worst, 1e-9);
  RecordProperty("worst_nmse", std::to_string(worst));
  api_->free_session(a);
  api_->free_session(b);
}

TEST_P(ModelTest, RewindReproducesLogits) {
  const size_t V = size_t(n_vocab_);
  const auto tok = tokens(20);
  ts_session* s = open(2);
  std::vector<float> first(V), again(V), scratch(V);
  ASSERT_EQ(api_->prefill(s, tok.data(), 12, 0, scratch.data()), TS_OK);
  ASSERT_EQ(api_->decode(s, tok[12], first.data()), TS_OK);
  for (int i = 13; i < 20; ++i) ASSERT_EQ(api_->decode(s, tok[size_t(i)], scratch.data()), TS_OK);
  ASSERT_EQ(api_->position(s), 20);
  ASSERT_EQ(api_->rewind(s, 12), TS_OK);
  ASSERT_EQ(api_->position(s), 12);
  ASSERT_EQ(api_->decode(s, tok[12], again.data()), TS_OK);
  EXPECT_EQ(std::memcmp(first.data(), again.data(), V * sizeof(float)), 0);
  EXPECT_EQ(api_->rewind(s, 14), TS_ERR_INVALID_ARGUMENT);
  api_->free_session(s);
}

// Same inputs -> same bits, across runs and thread counts 1, 2, 3.
TEST_P(ModelTest, BitwiseDeterministicAcrossRunsAndThreads) {
  const size_t N = 150, V = size_t(n_vocab_);  // > kMaxBatch: exercises prefill chunking too
  const auto tok = tokens(N);
  std::vector<float> ref(2 * V), out(2 * V);
  for (int threads : {1, 2, 2, 3}) {
    ts_session* s = open(threads);
    std::vector<float>& dst = threads == 1 ? ref : out;
    ASSERT_EQ(api_->prefill(s, tok.data(), int32_t(N), 0, dst.data()), TS_OK);
    ASSERT_EQ(api_->decode(s, 42, dst.data() + V), TS_OK);
    if (threads != 1) {
      EXPECT_EQ(std::memcmp(ref.data(), out.data(), 2 * V * sizeof(float)), 0) << threads;
    }
    api_->free_session(s);
  }
}

TEST_P(ModelTest, ErrorsAreReported) {
  ts_session* s = open(1, 4);
  std::vector<float> l(static_cast<size_t>(n_vocab_));
  const int32_t bad = n_vocab_;
  EXPECT_EQ(api_->decode(s, bad, l.data()), TS_ERR_INVALID_ARGUMENT);
  const auto tok = tokens(5);
  EXPECT_EQ(api_->prefill(s, tok.data(), 5, 0, l.data()), TS_ERR_CONTEXT_FULL);
  api_->free_session(s);
  ts_session_options o{};
  o.struct_size = sizeof(o);
  o.weight_path = GetParam();
  o.fault = "no_such_fault";
  ts_session* f = nullptr;
  EXPECT_EQ(api_->open_session(model_, &o, &f), TS_ERR_UNSUPPORTED);
}

INSTANTIATE_TEST_SUITE_P(Paths, ModelTest,
                         ::testing::Values(TS_WEIGHTS_QUANTIZED, TS_WEIGHTS_FULL_PRECISION),
                         [](const auto& pi) {
                           return pi.param == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision";
                         });

}  // namespace
