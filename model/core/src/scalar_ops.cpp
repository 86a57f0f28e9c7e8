// scalar_ops.cpp - see touchstone/model/scalar_ops.h for the formulas and the order.
#include "touchstone/model/scalar_ops.h"

namespace touchstone::ops {

// target_clones only lets the compiler keep the four partial sums in one vector
// register; the operations and their order are the same on every target (no
// reassociation, -ffp-contract=off), so results are bitwise equal.
__attribute__((target_clones("avx2", "default"))) double dot(const float* a, const float* b,
                                                             int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double{a[i + 0]} * double{b[i + 0]};
    s1 += double{a[i + 1]} * double{b[i + 1]};
    s2 += double{a[i + 2]} * double{b[i + 2]};
    s3 += double{a[i + 3]} * double{b[i + 3]};
  }
  for (; i < n; ++i) s0 += double{a[i]} * double{b[i]};
  return (s0 + s1) + (s2 + s3);
}

void rms_norm(const float* x, const float* weight, float* out, int64_t n, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double{x[i]} * double{x[i]};
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(double{x[i]} * inv * double{weight[i]});
}

void rope_interleaved(float* v, int64_t n_rot, int32_t pos, double base, double scale,
                      const float* freq_factors) {
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double ff = freq_factors ? double{freq_factors[i]} : 1.0;
    const double theta = rope_theta(pos, i, n_rot, base, scale, ff);
    const double c = std::cos(theta), s = std::sin(theta);
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = static_cast<float>(x0 * c - x1 * s);
    v[2 * i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

void rope_neox(float* v, int64_t n_rot, int32_t pos, double base, double scale,
               const float* freq_factors) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double ff = freq_factors ? double{freq_factors[i]} : 1.0;
    const double theta = rope_theta(pos, i, n_rot, base, scale, ff);
    const double c = std::cos(theta), s = std::sin(theta);
    const double x0 = v[i], x1 = v[i + half];
    v[i] = static_cast<float>(x0 * c - x1 * s);
    v[i + half] = static_cast<float>(x0 * s + x1 * c);
  }
}

}  // namespace touchstone::ops
