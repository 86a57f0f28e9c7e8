// Unit tests for touchstone/metrics/metrics.h. Expected values are closed forms
// computed by hand (derivations in the comments), not re-runs of the code.
#include "touchstone/metrics/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "touchstone/common/error.h"

namespace mt = touchstone::metrics;
using touchstone::Error;

namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kE = std::exp(1.0);
const double kLn2 = std::log(2.0);

// Deterministic pseudo-random logits in [-scale, scale] (64-bit LCG).
std::vector<float> lcg_logits(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = static_cast<double>(s >> 11) / 9007199254740992.0;  // [0,1)
    x = static_cast<float>((2.0 * u - 1.0) * scale);
  }
  return v;
}

// The expected-message check: an Error whose text contains `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected touchstone::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------

TEST(Argmax, TiesGoToLowestId) {
  const std::vector<float> v{1.f, 3.f, 3.f, 2.f};
  EXPECT_EQ(mt::argmax(v), 1);
  const std::vector<float> neg{-1.f, -1.f};
  EXPECT_EQ(mt::argmax(neg), 0);
}

TEST(Argmax, NanNeverWinsInfDoes) {
  const std::vector<float> a{kNaNf, 1.f, 5.f, kNaNf};
  EXPECT_EQ(mt::argmax(a), 2);
  const std::vector<float> b{1.f, kInff, 2.f};
  EXPECT_EQ(mt::argmax(b), 1);
  const std::vector<float> c{kNaNf, -kInff};
  EXPECT_EQ(mt::argmax(c), 1);
  const std::vector<float> all_nan{kNaNf, kNaNf};
  EXPECT_EQ(mt::argmax(all_nan), mt::kNoToken);
}

TEST(Argmax, EmptyThrows) {
  expect_error([] { mt::argmax(std::span<const float>{}); }, "logits is empty");
}

TEST(TopK, DescendingWithTiesToLowerId) {
  const std::vector<float> v{1.f, 5.f, 3.f, 5.f, 2.f};
  const mt::TopK t = mt::top_k(v, 3);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(t.values, (std::vector<float>{5.f, 5.f, 3.f}));
}

TEST(TopK, ClipsKAndPutsNanLast) {
  const std::vector<float> v{kNaNf, 1.f, -kInff, 2.f, kNaNf};
  const mt::TopK t = mt::top_k(v, 10);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{3, 1, 2, 0, 4}));
  ASSERT_EQ(t.values.size(), 5u);
  EXPECT_EQ(t.values[2], -kInff);
  EXPECT_TRUE(std::isnan(t.values[3]));
}

TEST(TopK, Errors) {
  const std::vector<float> v{1.f, 2.f};
  expect_error([&] { mt::top_k(v, 0); }, "k = 0");
  expect_error([&] { mt::top_k(v, -3); }, "k = -3");
  expect_error([] { mt::top_k(std::span<const float>{}, 1); }, "logits is empty");
}

TEST(LogSumExp, HandValues) {
  const std::vector<float> two{0.f, 0.f};
  EXPECT_NEAR(mt::log_sum_exp(two), kLn2, 1e-15);
  // 3 + log(1 + e^-1 + e^-2)
  const std::vector<float> v{1.f, 2.f, 3.f};
  EXPECT_NEAR(mt::log_sum_exp(v), 3.0 + std::log(1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-14);
  // max shift: no overflow
  const std::vector<float> big{1000.f, 1000.f};
  EXPECT_NEAR(mt::log_sum_exp(big), 1000.0 + kLn2, 1e-12);
  const std::vector<float> small{-1000.f, -1000.f, -1000.f, -1000.f};
  EXPECT_NEAR(mt::log_sum_exp(small), -1000.0 + 2 * kLn2, 1e-12);
}

TEST(LogSumExp, SpecialValues) {
  const std::vector<float> with_ninf{-kInff, 0.f};
  EXPECT_EQ(mt::log_sum_exp(with_ninf), 0.0);
  const std::vector<float> all_ninf{-kInff, -kInff};
  EXPECT_EQ(mt::log_sum_exp(all_ninf), -kInf);
  const std::vector<float> pinf{1.f, kInff};
  EXPECT_EQ(mt::log_sum_exp(pinf), kInf);
  const std::vector<float> nan{1.f, kNaNf, kInff};
  EXPECT_TRUE(std::isnan(mt::log_sum_exp(nan)));
  expect_error([] { mt::log_sum_exp(std::span<const float>{}); }, "empty");
}

TEST(Finite, CountsNanAndInf) {
  const std::vector<float> v{1.f, kNaNf, kInff, -kInff, 0.f};
  EXPECT_FALSE(mt::all_finite(v));
  EXPECT_EQ(mt::count_nonfinite(v), 3u);
  const std::vector<float> ok{1.f, -2.f, 3e38f};
  EXPECT_TRUE(mt::all_finite(ok));
  EXPECT_EQ(mt::count_nonfinite(ok), 0u);
}

TEST(Nmse, KnownVectors) {
  // (1-1)^2 + (2-2)^2 + (3-4)^2 = 1 over 1 + 4 + 9 = 14
  const std::vector<float> r{1.f, 2.f, 3.f}, t{1.f, 2.f, 4.f};
  EXPECT_DOUBLE_EQ(mt::nmse(r, t), 1.0 / 14.0);
  // test all zero: NMSE = 1
  const std::vector<float> r2{3.f, 4.f}, t2{0.f, 0.f};
  EXPECT_DOUBLE_EQ(mt::nmse(r2, t2), 1.0);
  // asymmetric: denominator is the reference
  EXPECT_DOUBLE_EQ(mt::nmse(t, r), 1.0 / 21.0);
  EXPECT_EQ(mt::nmse(r, r), 0.0);
}

TEST(Nmse, ZeroReferenceAndNonFinite) {
  const std::vector<float> z{0.f, 0.f}, one{0.f, 1.f};
  EXPECT_EQ(mt::nmse(z, z), 0.0);
  EXPECT_EQ(mt::nmse(z, one), kInf);
  const std::vector<float> r{1.f, 2.f}, tn{1.f, kNaNf}, ti{1.f, kInff}, rn{kNaNf, 2.f};
  EXPECT_EQ(mt::nmse(r, tn), kInf);
  EXPECT_EQ(mt::nmse(r, ti), kInf);
  EXPECT_EQ(mt::nmse(rn, r), kInf);
  EXPECT_EQ(mt::nmse(ti, ti), kInf);  // equal infinities are still not accepted
}

TEST(Nmse, Errors) {
  const std::vector<float> a{1.f, 2.f}, b{1.f, 2.f, 3.f};
  expect_error([&] { mt::nmse(a, b); }, "ref has 2 entries, test has 3");
  expect_error([] { mt::nmse(std::span<const float>{}, std::span<const float>{}); },
               "ref is empty");
}

TEST(MaxAbsDiff, KnownVectorsAndNonFinite) {
  const std::vector<float> r{1.f, -2.f, 3.f}, t{1.5f, -2.f, 0.f};
  EXPECT_EQ(mt::max_abs_diff(r, t), 3.0);
  EXPECT_EQ(mt::max_abs_diff(r, r), 0.0);
  const std::vector<float> tn{1.f, kNaNf, 3.f};
  EXPECT_EQ(mt::max_abs_diff(r, tn), kInf);
  const std::vector<float> b{1.f};
  expect_error([&] { mt::max_abs_diff(r, b); }, "ref has 3 entries, test has 1");
}

TEST(Top2Margin, Values) {
  const std::vector<float> v{1.f, 4.f, 2.5f};
  EXPECT_EQ(mt::top2_margin(v), 1.5);
  const std::vector<float> tie{3.f, 3.f, 1.f};
  EXPECT_EQ(mt::top2_margin(tie), 0.0);
  const std::vector<float> nan{kNaNf, 1.f};
  EXPECT_TRUE(std::isnan(mt::top2_margin(nan)));
  const std::vector<float> one{1.f};
  expect_error([&] { mt::top2_margin(one); }, "logits has 1 entries");
}

// ---------------------------------------------------------------------------
// KL

TEST(KlFull, HandComputedTwoPoint) {
  // P = (1/2, 1/2); Q = (e, 1)/(1+e).
  // KL = 1/2 ln(1/2 / q1) + 1/2 ln(1/2 / q2) = -ln2 - 1/2 (ln q1 + ln q2)
  //    = -ln2 - 1/2 (1 - 2 ln(1+e)) = ln(1+e) - 1/2 - ln2 = 0.120114506958...
  const std::vector<float> r{0.f, 0.f}, t{1.f, 0.f};
  const double expected = std::log(1.0 + kE) - 0.5 - kLn2;
  EXPECT_NEAR(expected, 0.120114506958, 1e-11);
  EXPECT_NEAR(mt::kl_divergence_full(r, t), expected, 1e-14);
  // Reverse direction: KL(Q||P) = q1 ln(2 q1) + q2 ln(2 q2), different value.
  const double q1 = kE / (1 + kE), q2 = 1 / (1 + kE);
  EXPECT_NEAR(mt::kl_divergence_full(t, r), q1 * std::log(2 * q1) + q2 * std::log(2 * q2), 1e-14);
}

TEST(KlFull, HandComputedThreePoint) {
  // P = (1/2, 1/4, 1/4), Q = (1/4, 1/4, 1/2):
  // KL = 1/2 ln 2 + 0 + 1/4 ln(1/2) = ln2 / 4. Logits are float(ln p), so ~1e-8 slack.
  const std::vector<float> r{std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  const std::vector<float> t{std::log(0.25f), std::log(0.25f), std::log(0.5f)};
  EXPECT_NEAR(mt::kl_divergence_full(r, t), kLn2 / 4.0, 1e-7);
}

TEST(KlFull, IdenticalIsExactlyZeroAndShiftInvariant) {
  const auto r = lcg_logits(1000, 1, 10.f);
  EXPECT_EQ(mt::kl_divergence_full(r, r), 0.0);
  std::vector<float> shifted{0.5f, 1.25f, -3.f, 2.f};
  const std::vector<float> base = shifted;
  for (auto& x : shifted) x += 7.f;  // exact in float
  EXPECT_LT(mt::kl_divergence_full(base, shifted), 1e-14);
}

TEST(KlFull, NonFiniteAndErrors) {
  const std::vector<float> r{0.f, 1.f}, tn{0.f, kNaNf}, ti{kInff, 1.f}, tni{-kInff, 1.f};
  EXPECT_EQ(mt::kl_divergence_full(r, tn), kInf);
  EXPECT_EQ(mt::kl_divergence_full(r, ti), kInf);
  EXPECT_EQ(mt::kl_divergence_full(r, tni), kInf);
  expect_error([&] { mt::kl_divergence_full(tn, r); }, "ref_logits[1]");
  const std::vector<float> three{0.f, 1.f, 2.f};
  expect_error([&] { mt::kl_divergence_full(r, three); },
               "ref_logits has 2 entries, test_logits has 3");
}

TEST(KlTopK, FullVocabEqualsFullKl) {
  const auto r = lcg_logits(512, 7, 8.f);
  const auto t = lcg_logits(512, 8, 8.f);
  // Stored in a scrambled order: the estimate must not depend on it.
  std::vector<int32_t> ids(r.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::reverse(ids.begin(), ids.end());
  std::vector<float> vals;
  for (auto id : ids) vals.push_back(r[static_cast<size_t>(id)]);
  const auto e = mt::kl_divergence_topk(ids, vals, mt::log_sum_exp(r), t);
  const double full = mt::kl_divergence_full(r, t);
  EXPECT_GT(full, 0.1);  // a real divergence, not a trivial 0 == 0
  EXPECT_NEAR(e.kl, full, 1e-12);
  EXPECT_EQ(e.p_tail, 0.0);
  EXPECT_EQ(e.q_tail, 0.0);
  EXPECT_EQ(e.kl_upper, e.kl);
}

TEST(KlTopK, HandComputedTailConditionalsEqual) {
  // P uniform on 4 tokens, stored K = 2 (ids 0, 1), lse = ln 4, P_tail = 1/2.
  // Q = (e, 1, 1, 1)/(e+3): Q_tail = 2/(e+3), tail conditionals both uniform, so
  // KL_est = KL_true = ln(e+3) - ln4 - 1/4.
  const std::vector<int32_t> ids{0, 1};
  const std::vector<float> vals{0.f, 0.f};
  const std::vector<float> t{1.f, 0.f, 0.f, 0.f};
  const auto e = mt::kl_divergence_topk(ids, vals, std::log(4.0), t);
  const double expected = std::log(kE + 3) - 2 * kLn2 - 0.25;
  EXPECT_NEAR(e.kl, expected, 1e-14);
  EXPECT_NEAR(e.p_tail, 0.5, 1e-15);
  EXPECT_NEAR(e.q_tail, 2 / (kE + 3), 1e-15);
  const std::vector<float> r{0.f, 0.f, 0.f, 0.f};
  EXPECT_NEAR(mt::kl_divergence_full(r, t), expected, 1e-14);
}

TEST(KlTopK, HandComputedTailGapAndBound) {
  // P uniform on 4, K = 2 (ids 0, 1). Q = (1, 1, e, 1)/(e+3): Q_tail = (e+1)/(e+3).
  // KL_est = 2 * 1/4 ln((e+3)/4) + 1/2 ln((1/2)(e+3)/(e+1)) = ln(e+3) - 1.5 ln2 - 0.5 ln(e+1)
  // KL_true = sum_j 1/4 ln((e+3)/(4 e^{t_j})) = ln(e+3) - 2 ln2 - 1/4
  // gap = P_tail KL(uniform{2,3} || (e,1)/(e+1)) = 1/2 (ln(e+1) - ln2 - 1/2)
  // bound: P_tail * [(r_min - lse_r) - (t_tailmin - lse_t) - ln(P_tail/Q_tail)]
  //      = 1/2 [ -ln4 + ln(e+3) - ln(1/2) + ln((e+1)/(e+3)) ] = 1/2 (ln(e+1) - ln2)
  const std::vector<int32_t> ids{1, 0};
  const std::vector<float> vals{0.f, 0.f};
  const std::vector<float> r{0.f, 0.f, 0.f, 0.f};
  const std::vector<float> t{0.f, 0.f, 1.f, 0.f};
  const auto e = mt::kl_divergence_topk(ids, vals, std::log(4.0), t);
  const double est = std::log(kE + 3) - 1.5 * kLn2 - 0.5 * std::log(kE + 1);
  const double full = std::log(kE + 3) - 2 * kLn2 - 0.25;
  EXPECT_NEAR(e.kl, est, 1e-14);
  EXPECT_NEAR(mt::kl_divergence_full(r, t), full, 1e-14);
  EXPECT_NEAR(full - e.kl, 0.5 * (std::log(kE + 1) - kLn2 - 0.5), 1e-14);
  EXPECT_NEAR(e.kl_upper, est + 0.5 * (std::log(kE + 1) - kLn2), 1e-14);
  EXPECT_LT(e.kl, full);
  EXPECT_GE(e.kl_upper, full);
}

TEST(KlTopK, EstimateBelowFullAndGapIdentityRandomRows) {
  const size_t V = 300;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const auto r = lcg_logits(V, seed, 6.f);
    const auto t = lcg_logits(V, seed + 1000, 6.f);
    for (int K : {1, 5, 50, 299}) {
      const mt::TopK top = mt::top_k(r, K);
      const double lse_r = mt::log_sum_exp(r), lse_t = mt::log_sum_exp(t);
      const auto e = mt::kl_divergence_topk(top.ids, top.values, lse_r, t);
      const double full = mt::kl_divergence_full(r, t);
      // Independent computation of the tail quantities from the full rows.
      std::vector<bool> in_top(V, false);
      for (auto id : top.ids) in_top[static_cast<size_t>(id)] = true;
      double P = 0, Q = 0;
      for (size_t j = 0; j < V; ++j) {
        if (in_top[j]) continue;
        P += std::exp(r[j] - lse_r);
        Q += std::exp(t[j] - lse_t);
      }
      double kl_cond = 0, max_lr = -kInf;
      for (size_t j = 0; j < V; ++j) {
        if (in_top[j]) continue;
        const double lp = r[j] - lse_r, lq = t[j] - lse_t;
        kl_cond += std::exp(lp) / P * ((lp - std::log(P)) - (lq - std::log(Q)));
        max_lr = std::max(max_lr, lp - lq);
      }
      SCOPED_TRACE(testing::Message() << "seed " << seed << " K " << K);
      EXPECT_NEAR(e.p_tail, P, 1e-13);
      EXPECT_NEAR(e.q_tail, Q, 1e-13);
      EXPECT_LE(e.kl, full + 1e-13);
      EXPECT_GE(e.kl, 0.0);
      // KL_true - KL_est = P_tail * KL(P|tail || Q|tail)
      EXPECT_NEAR(full - e.kl, P * kl_cond, 1e-12);
      // gap <= P_tail * (max_{j in tail} ln(p_j/q_j) - ln(P_tail/Q_tail))
      EXPECT_LE(full - e.kl, P * (max_lr - std::log(P / Q)) + 1e-12);
      // and the computable bound from stored data holds
      EXPECT_GE(e.kl_upper + 1e-12, full);
    }
  }
}

TEST(KlTopK, IdenticalIsExactlyZero) {
  // Without the bitwise-identical rule, the tail term P_tail (ln P_tail - ln Q_tail)
  // with P_tail = 1 - sum p and Q_tail summed directly is ~1e-15 for about half
  // of these rows; the reference backend against its own goldens must give 0.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const auto r = lcg_logits(500, seed, static_cast<float>(seed % 7 + 1));
    const double lse = mt::log_sum_exp(r);
    for (int K : {1, 3, 10, 50, 200, 500}) {
      const mt::TopK top = mt::top_k(r, K);
      const auto e = mt::kl_divergence_topk(top.ids, top.values, lse, r);
      EXPECT_EQ(e.kl, 0.0) << "seed " << seed << " K " << K;
    }
  }
}

TEST(KlTopK, NonFiniteTestIsInfinite) {
  const std::vector<int32_t> ids{0, 1};
  const std::vector<float> vals{0.f, 0.f};
  for (float bad : {kNaNf, kInff, -kInff}) {
    const std::vector<float> t{0.f, 0.f, bad, 0.f};
    const auto e = mt::kl_divergence_topk(ids, vals, std::log(4.0), t);
    EXPECT_EQ(e.kl, kInf);
    EXPECT_EQ(e.kl_upper, kInf);
    EXPECT_NEAR(e.p_tail, 0.5, 1e-15);  // reference-only quantity still reported
  }
}

TEST(KlTopK, Errors) {
  const std::vector<float> t{0.f, 0.f, 0.f, 0.f};
  const std::vector<int32_t> ids{0, 1}, dup{2, 2}, oob{0, 4}, neg{-1, 0}, one{0};
  const std::vector<float> vals{0.f, 0.f}, nanv{0.f, kNaNf};
  const double lse = std::log(4.0);
  expect_error([&] { mt::kl_divergence_topk(one, vals, lse, t); },
               "ref_topk_ids has 1 entries, ref_topk_logits has 2");
  expect_error([&] { mt::kl_divergence_topk(dup, vals, lse, t); }, "id 2 more than once");
  expect_error([&] { mt::kl_divergence_topk(oob, vals, lse, t); },
               "ref_topk_ids[1] = 4 out of range [0, 4)");
  expect_error([&] { mt::kl_divergence_topk(neg, vals, lse, t); }, "ref_topk_ids[0] = -1");
  expect_error([&] { mt::kl_divergence_topk(ids, nanv, lse, t); }, "ref_topk_logits[1]");
  expect_error([&] { mt::kl_divergence_topk(ids, vals, std::nan(""), t); }, "ref_lse");
  // lse = 0 makes the two stored probabilities 1 each: mass 2 > 1.
  expect_error([&] { mt::kl_divergence_topk(ids, vals, 0.0, t); }, "top-K mass");
  expect_error([&] { mt::kl_divergence_topk(ids, vals, lse, std::span<const float>{}); },
               "test_logits is empty");
  expect_error([&] { mt::kl_divergence_topk({}, {}, lse, t); }, "ref_topk_ids is empty");
  const std::vector<float> t1{0.f};
  expect_error([&] { mt::kl_divergence_topk(ids, vals, lse, t1); }, "only 1");
}

// ---------------------------------------------------------------------------
// Summaries

TEST(Summarize, OneToHundred) {
  std::vector<double> v(100);
  for (size_t i = 0; i < 100; ++i) v[i] = static_cast<double>(100 - i);  // unsorted input
  const mt::Summary s = mt::summarize(v);
  EXPECT_EQ(s.n, 100u);
  EXPECT_EQ(s.mean, 50.5);
  EXPECT_EQ(s.median, 50.0);  // nearest rank: ceil(0.5*100) = 50th value
  EXPECT_EQ(s.p90, 90.0);
  EXPECT_EQ(s.p95, 95.0);
  EXPECT_EQ(s.p99, 99.0);
  EXPECT_EQ(s.max, 100.0);
  EXPECT_EQ(s.min, 1.0);
}

TEST(Summarize, SmallNNearestRank) {
  // n = 10: ranks ceil(5) = 5, ceil(9) = 9, ceil(9.5) = 10, ceil(9.9) = 10.
  const std::vector<double> v{10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  const mt::Summary s = mt::summarize(v);
  EXPECT_EQ(s.median, 5.0);
  EXPECT_EQ(s.p90, 9.0);
  EXPECT_EQ(s.p95, 10.0);
  EXPECT_EQ(s.p99, 10.0);
  // n = 3: median rank ceil(1.5) = 2
  const std::vector<double> w{3.0, 1.0, 2.0};
  EXPECT_EQ(mt::summarize(w).median, 2.0);
  const std::vector<double> single{0.25};
  const mt::Summary one = mt::summarize(single);
  EXPECT_EQ(one.p99, 0.25);
  EXPECT_EQ(one.median, 0.25);
  EXPECT_EQ(one.mean, 0.25);
}

TEST(Summarize, InfAllowedNanAndEmptyRejected) {
  const std::vector<double> v{0.0, kInf, 1.0};
  const mt::Summary s = mt::summarize(v);
  EXPECT_EQ(s.max, kInf);
  EXPECT_EQ(s.mean, kInf);
  EXPECT_EQ(s.median, 1.0);
  const std::vector<double> n{0.0, std::nan("")};
  expect_error([&] { mt::summarize(n); }, "values[1] is NaN");
  expect_error([] { mt::summarize(std::span<const double>{}); }, "values is empty");
}

// ---------------------------------------------------------------------------
// Scoring accumulator

TEST(Scoring, HandComputedTwoPositions) {
  mt::ScoringAccumulator acc;
  const std::vector<int32_t> all{0, 1, 2, 3};
  // Position 1: ref = test = (2,0,0,0), target 0. KL 0, top-1 agrees, same NLL.
  {
    const std::vector<float> r{2.f, 0.f, 0.f, 0.f};
    acc.add(all, r, mt::log_sum_exp(r), r[0], 0, r);
  }
  // Position 2: ref (0,0,0,0) (top-1 = id 0 by tie rule), test (0,0,1,0), target 2.
  // KL = ln(e+3) - 2 ln2 - 1/4; argmax(test) = 2 != 0; p = 1/4, q = e/(e+3).
  {
    const std::vector<float> r{0.f, 0.f, 0.f, 0.f}, t{0.f, 0.f, 1.f, 0.f};
    acc.add(all, r, std::log(4.0), r[2], 2, t);
  }
  const mt::ScoringStats s = acc.finish();
  const double kl2 = std::log(kE + 3) - 2 * kLn2 - 0.25;
  const double nll1 = std::log(kE * kE + 3) - 2;
  EXPECT_EQ(s.n_positions, 2u);
  EXPECT_EQ(s.kld.min, 0.0);
  EXPECT_EQ(s.kld.median, 0.0);  // nearest rank ceil(1) = 1st of {0, kl2}
  EXPECT_NEAR(s.kld.max, kl2, 1e-14);
  EXPECT_NEAR(s.kld.mean, kl2 / 2, 1e-14);
  EXPECT_EQ(s.max_p_tail, 0.0);
  EXPECT_EQ(s.top1_agreement, 0.5);
  const double dp = kE / (kE + 3) - 0.25;
  EXPECT_NEAR(s.rms_delta_p, std::sqrt(dp * dp / 2), 1e-14);
  EXPECT_NEAR(s.ppl_ref, std::exp((nll1 + 2 * kLn2) / 2), 1e-12);
  EXPECT_NEAR(s.ppl_test, std::exp((nll1 + std::log(kE + 3) - 1) / 2), 1e-12);
  EXPECT_NEAR(s.ppl_ratio, std::exp((std::log(kE + 3) - 1 - 2 * kLn2) / 2), 1e-12);
  EXPECT_EQ(s.n_nonfinite_positions, 0u);
}

TEST(Scoring, TailMassAndNonFiniteRow) {
  mt::ScoringAccumulator acc;
  const std::vector<int32_t> ids{1, 0};
  const std::vector<float> vals{0.f, 0.f};
  const std::vector<float> good{0.f, 0.f, 0.f, 0.f};
  acc.add(ids, vals, std::log(4.0), 0.f, 3, good);  // identical, P_tail = 1/2
  {
    const mt::ScoringStats s = acc.finish();
    EXPECT_NEAR(s.max_p_tail, 0.5, 1e-15);
    EXPECT_EQ(s.kld.max, 0.0);
    EXPECT_EQ(s.top1_agreement, 1.0);
    EXPECT_NEAR(s.ppl_ref, 4.0, 1e-12);
    EXPECT_NEAR(s.ppl_ratio, 1.0, 1e-15);
  }
  const std::vector<float> bad{kNaNf, 0.f, 0.f, 0.f};  // argmax would be 1 (NaN skipped)
  acc.add(ids, vals, std::log(4.0), 0.f, 3, bad);
  const mt::ScoringStats s = acc.finish();
  EXPECT_EQ(s.n_nonfinite_positions, 1u);
  EXPECT_EQ(s.kld.max, kInf);
  EXPECT_EQ(s.top1_agreement, 0.5);
  EXPECT_EQ(s.rms_delta_p, kInf);
  EXPECT_EQ(s.ppl_test, kInf);
  EXPECT_EQ(s.ppl_ratio, kInf);
  EXPECT_NEAR(s.ppl_ref, 4.0, 1e-12);
}

TEST(Scoring, Errors) {
  mt::ScoringAccumulator acc;
  expect_error([&] { (void)acc.finish(); }, "no positions");
  const std::vector<int32_t> ids{0, 1};
  const std::vector<float> vals{0.f, 0.f}, t{0.f, 0.f, 0.f};
  const double lse = std::log(3.0);
  expect_error([&] { acc.add(ids, vals, lse, 0.f, 3, t); }, "target_id = 3 out of range [0, 3)");
  expect_error([&] { acc.add(ids, vals, lse, kNaNf, 0, t); }, "ref_target_logit");
  expect_error([&] { acc.add(ids, vals, lse, 5.f, 0, t); }, "exceeds ref_lse");
}

// ---------------------------------------------------------------------------
// Near-tie rule

// Reference top-3 stored out of order: ranked 5 (3.0), 2 (2.99), 7 (1.0); margin ~0.01.
const std::vector<int32_t> kRefIds{2, 7, 5};
const std::vector<float> kRefVals{2.99f, 1.0f, 3.0f};

TEST(NearTie, AcceptsSwappedNearTie) {
  // test ranks 2 first, 5 second
  const std::vector<float> t{0.f, 0.f, 3.1f, 0.f, 0.f, 3.0f, 0.f, 1.f};
  const auto v = mt::near_tie(kRefIds, kRefVals, 2, t, 0.05, 2);
  EXPECT_TRUE(v.accepted);
  EXPECT_NEAR(v.ref_margin, 0.01, 1e-6);
  EXPECT_TRUE(v.test_in_ref_topk);
  EXPECT_TRUE(v.ref_in_test_topk);
}

TEST(NearTie, RejectsWideMargin) {
  const std::vector<float> t{0.f, 0.f, 3.1f, 0.f, 0.f, 3.0f, 0.f, 1.f};
  const auto v = mt::near_tie(kRefIds, kRefVals, 2, t, 0.005, 2);
  EXPECT_FALSE(v.accepted);
  EXPECT_TRUE(v.test_in_ref_topk);
  EXPECT_TRUE(v.ref_in_test_topk);
}

TEST(NearTie, TestTokenMustBeInRefTopK) {
  // test picks 7: rank 3 in the reference
  const std::vector<float> t{0.f, 0.f, 1.f, 0.f, 0.f, 3.0f, 0.f, 3.1f};
  const auto v2 = mt::near_tie(kRefIds, kRefVals, 7, t, 0.05, 2);
  EXPECT_FALSE(v2.accepted);
  EXPECT_FALSE(v2.test_in_ref_topk);
  EXPECT_TRUE(v2.ref_in_test_topk);
  const auto v3 = mt::near_tie(kRefIds, kRefVals, 7, t, 0.05, 3);
  EXPECT_TRUE(v3.accepted);
  // token 4 is not stored at all
  const auto v4 = mt::near_tie(kRefIds, kRefVals, 4, t, 0.05, 100);
  EXPECT_FALSE(v4.test_in_ref_topk);
  EXPECT_FALSE(v4.accepted);
}

TEST(NearTie, RefTokenMustBeInTestTopKWithTieOrder) {
  // test: id 2 = 5, ids 1 and 5 tie at 4 -> ranking 2, 1, 5 (tie to lower id):
  // ref token 5 is rank 3, outside the test top-2.
  const std::vector<float> t{0.f, 4.f, 5.f, 0.f, 0.f, 4.f, 0.f, 0.f};
  const auto v = mt::near_tie(kRefIds, kRefVals, 2, t, 0.05, 2);
  EXPECT_FALSE(v.ref_in_test_topk);
  EXPECT_FALSE(v.accepted);
  EXPECT_TRUE(mt::near_tie(kRefIds, kRefVals, 2, t, 0.05, 3).accepted);
}

TEST(NearTie, SameTokenAcceptedNonFiniteRejected) {
  const std::vector<float> t{0.f, 0.f, 0.f, 0.f, 0.f, 9.f, 0.f, 0.f};
  const auto v = mt::near_tie(kRefIds, kRefVals, 5, t, 0.0, 1);
  EXPECT_TRUE(v.accepted);  // no divergence at all
  std::vector<float> tn = t;
  tn[0] = kNaNf;
  EXPECT_FALSE(mt::near_tie(kRefIds, kRefVals, 5, tn, 0.05, 2).accepted);
  std::vector<float> ti{0.f, 0.f, 3.1f, 0.f, 0.f, 3.0f, 0.f, kInff};
  EXPECT_FALSE(mt::near_tie(kRefIds, kRefVals, 2, ti, 0.05, 2).accepted);
}

TEST(NearTie, Errors) {
  const std::vector<float> t(8, 0.f);
  const std::vector<int32_t> one_id{5};
  const std::vector<float> one_val{3.f};
  expect_error([&] { mt::near_tie(one_id, one_val, 5, t, 0.05, 2); }, "need at least 2");
  expect_error([&] { mt::near_tie(kRefIds, kRefVals, 8, t, 0.05, 2); },
               "test_token = 8 out of range [0, 8)");
  expect_error([&] { mt::near_tie(kRefIds, kRefVals, 2, t, 0.05, 0); }, "k = 0");
  expect_error([&] { mt::near_tie(kRefIds, kRefVals, 2, t, -1.0, 2); }, "margin_eps");
  const std::vector<float> short_t(6, 0.f);
  expect_error([&] { mt::near_tie(kRefIds, kRefVals, 2, short_t, 0.05, 2); },
               "ref_topk_ids[1] = 7 out of range");
}

}  // namespace
