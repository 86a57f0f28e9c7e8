// kl_divergence_topn: a lower bound on the exact KL, 0 for the reference's own
// top-N, +inf for rows that carry nothing usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "touchstone/metrics/metrics.h"

namespace mt = touchstone::metrics;

namespace {

struct Ref {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  double lse;
};

// The stored top-K of a full reference row (descending, ties -> lower id).
Ref top_k(const std::vector<float>& row, size_t k) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  Ref r{{}, {}, mt::log_sum_exp(row)};
  for (size_t i = 0; i < k; ++i) {
    r.ids.push_back(order[i]);
    r.vals.push_back(row[size_t(order[i])]);
  }
  return r;
}

// A server's answer for a full logits row: log-probs of its top n, -inf elsewhere.
std::vector<float> top_n_row(const std::vector<float>& row, size_t n) {
  const Ref t = top_k(row, n);
  std::vector<float> out(row.size(), -INFINITY);
  for (size_t i = 0; i < n; ++i) out[size_t(t.ids[i])] = float(double(t.vals[i]) - t.lse);
  return out;
}

std::vector<float> random_row(std::mt19937& g, size_t v, double scale) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<float> r(v);
  for (float& x : r) x = float(d(g));
  return r;
}

TEST(KlTopN, IsALowerBoundOnTheExactKl) {
  std::mt19937 g(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t V = 300, K = 1 + trial % 40, N = 1 + (trial * 7) % 50;
    const std::vector<float> ref = random_row(g, V, 3.0);
    std::vector<float> test = ref;
    std::normal_distribution<double> noise(0.0, 0.05 + 0.02 * (trial % 30));
    for (float& x : test) x += float(noise(g));
    const Ref r = top_k(ref, K);
    const mt::TopNKlEstimate e = mt::kl_divergence_topn(r.ids, r.vals, r.lse, top_n_row(test, N));
    const double exact = mt::kl_divergence_full(ref, test);
    EXPECT_LE(e.kl, exact + 1e-5) << "trial " << trial << " K " << K << " N " << N;
    EXPECT_GE(e.kl, 0.0);
    EXPECT_EQ(e.n_returned, N);
  }
}

TEST(KlTopN, SeesADifferentDistribution) {
  std::mt19937 g(3);
  const std::vector<float> ref = random_row(g, 200, 3.0);
  std::vector<float> test = ref;
  std::swap(test[size_t(top_k(ref, 1).ids[0])], test[size_t(top_k(ref, 2).ids[1])]);
  const Ref r = top_k(ref, 32);
  const double lb = mt::kl_divergence_topn(r.ids, r.vals, r.lse, top_n_row(test, 32)).kl;
  EXPECT_GT(lb, 0.5 * mt::kl_divergence_full(ref, test));
}

TEST(KlTopN, ZeroForTheReferenceItself) {
  std::mt19937 g(5);
  const std::vector<float> ref = random_row(g, 500, 2.0);
  const Ref r = top_k(ref, 32);
  const mt::TopNKlEstimate e = mt::kl_divergence_topn(r.ids, r.vals, r.lse, top_n_row(ref, 64));
  EXPECT_LT(e.kl, 1e-6);
  EXPECT_EQ(e.n_missing, 0u);
}

TEST(KlTopN, MissingReferenceTokensAreCounted) {
  std::mt19937 g(9);
  const std::vector<float> ref = random_row(g, 100, 2.0);
  const Ref r = top_k(ref, 20);
  const mt::TopNKlEstimate e = mt::kl_divergence_topn(r.ids, r.vals, r.lse, top_n_row(ref, 5));
  EXPECT_EQ(e.n_missing, 15u);
  EXPECT_LT(e.kl, 1e-6);  // the same distribution: the bound may not exceed 0
}

TEST(KlTopN, UnusableRowsAreInfinite) {
  const Ref r{{0, 1}, {1.0f, 0.5f}, std::log(std::exp(1.0) + std::exp(0.5) + 1.0)};
  std::vector<float> none(3, -INFINITY);
  EXPECT_TRUE(std::isinf(mt::kl_divergence_topn(r.ids, r.vals, r.lse, none).kl));
  std::vector<float> nan{-0.5f, NAN, -INFINITY};
  EXPECT_TRUE(std::isinf(mt::kl_divergence_topn(r.ids, r.vals, r.lse, nan).kl));
  std::vector<float> pinf{-0.5f, INFINITY, -INFINITY};
  EXPECT_TRUE(std::isinf(mt::kl_divergence_topn(r.ids, r.vals, r.lse, pinf).kl));
}

}  // namespace
