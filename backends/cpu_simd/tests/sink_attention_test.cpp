// sink_attention_test.cpp - the attention kernels with an attention sink (gpt-oss: a
// logit per head that joins the softmax's maximum and denominator and attends to
// nothing; HF modeling_gpt_oss.py eager_attention_forward), on every compiled and
// supported Highway target:
//  * attend_f32 with a sink against softmax attention in fp64 with the sink's column;
//  * a sink of -inf (the default) gives the bits of the call without one;
//  * attend_multi_f32 with per-query sinks == attend_f32 per query, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels.h"

namespace {

using namespace touchstone::cpu_simd;

std::vector<float> normal_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

class SinkTargets : public ::testing::TestWithParam<std::pair<int64_t, std::string>> {
 protected:
  void SetUp() override { force_hwy_target(GetParam().first); }
  void TearDown() override { force_hwy_target(0); }
};

// softmax over [scores, sink] in fp64, the sink's column dropped, times V.
std::vector<double> fp64_attention(const std::vector<float>& q, const std::vector<float>& K,
                                   const std::vector<float>& V, size_t hd, size_t n_kv,
                                   double scale, double sink) {
  std::vector<double> p(n_kv);
  double mx = sink, sum = 0.0;
  for (size_t t = 0; t < n_kv; ++t) {
    double s = 0.0;
    for (size_t i = 0; i < hd; ++i) s += double{q[i]} * double{K[t * hd + i]};
    p[t] = s * scale;
    mx = std::max(mx, p[t]);
  }
  for (double& x : p) sum += (x = std::exp(x - mx));
  sum += std::exp(sink - mx);
  std::vector<double> out(hd, 0.0);
  for (size_t t = 0; t < n_kv; ++t)
    for (size_t j = 0; j < hd; ++j) out[j] += p[t] * double{V[t * hd + j]} / sum;
  return out;
}

// Sinks below, near and far above the scores (the sink then takes most of the mass).
TEST_P(SinkTargets, AttendWithSinkMatchesFp64Softmax) {
  ASSERT_EQ(hwy_current_target(), GetParam().second);
  const size_t hd = 32;
  for (size_t n_kv : {1u, 3u, 16u, 17u, 70u}) {
    const auto q = normal_vec(hd, 41, 2.0f);
    const auto K = normal_vec(n_kv * hd, 42), V = normal_vec(n_kv * hd, 43);
    for (float sink : {-20.0f, -1.5f, 0.0f, 2.5f, 30.0f}) {
      std::vector<float> scores(n_kv), out(hd);
      attend_f32(q.data(), K.data(), V.data(), hd, hd, n_kv, 0.125f, scores.data(), out.data(),
                 sink);
      const std::vector<double> ref = fp64_attention(q, K, V, hd, n_kv, 0.125, sink);
      for (size_t j = 0; j < hd; ++j)
        EXPECT_NEAR(out[j], ref[j], 2e-6) << "n_kv=" << n_kv << " sink=" << sink << " j=" << j;
    }
    std::vector<float> scores(n_kv), plain(hd), none(hd);
    attend_f32(q.data(), K.data(), V.data(), hd, hd, n_kv, 0.125f, scores.data(), plain.data());
    attend_f32(q.data(), K.data(), V.data(), hd, hd, n_kv, 0.125f, scores.data(), none.data(),
               -HUGE_VALF);
    EXPECT_EQ(plain, none) << "n_kv=" << n_kv;
  }
}

// Each query its own sink (the heads of one GQA group), ranges as a prefill block's.
TEST_P(SinkTargets, MultiQuerySinksEqualPerQueryBits) {
  ASSERT_EQ(hwy_current_target(), GetParam().second);
  const size_t hd = 32, ld = 2 * hd, max_g = 8;
  for (size_t n_kv : {1u, 9u, 40u}) {
    const auto Q = normal_vec(max_g * hd, 51, 2.0f);
    const auto K = normal_vec((n_kv + max_g) * ld, 52), V = normal_vec((n_kv + max_g) * ld, 53);
    const auto sinks = normal_vec(max_g, 54, 1.5f);
    for (size_t G : {1u, 2u, 3u, 4u, 5u, 8u}) {
      std::vector<size_t> t0(G), t1(G);
      std::vector<const float*> q(G);
      std::vector<float*> out(G);
      std::vector<float> got(G * hd), want(G * hd), scores(G * (n_kv + max_g));
      for (size_t g = 0; g < G; ++g) {
        t0[g] = g / 3;
        t1[g] = n_kv + g / 2;
        q[g] = Q.data() + g * hd;
        out[g] = got.data() + g * hd;
        std::vector<float> s1(t1[g] - t0[g]);
        attend_f32(q[g], K.data() + t0[g] * ld, V.data() + t0[g] * ld, ld, hd, t1[g] - t0[g],
                   0.125f, s1.data(), want.data() + g * hd, sinks[g]);
      }
      attend_multi_f32(G, q.data(), K.data(), V.data(), ld, hd, t0.data(), t1.data(), 0.125f,
                       scores.data(), n_kv + max_g, out.data(), sinks.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), G * hd * sizeof(float)), 0)
          << "n_kv=" << n_kv << " G=" << G;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, SinkTargets, ::testing::ValuesIn(hwy_targets()),
                         [](const auto& pi) { return pi.param.second; });

}  // namespace
