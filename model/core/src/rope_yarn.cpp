// rope_yarn.cpp - YaRN RoPE frequencies and rotation; see touchstone/model/rope_yarn.h.
#include "touchstone/model/rope_yarn.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace touchstone::ops {
namespace {

// HF find_correction_dim / ggml_rope_yarn_corr_dim: the dimension whose wavelength makes
// `rotations` turns over orig_ctx positions.
double correction_dim(double rotations, int64_t d, double base, int32_t orig_ctx) {
  return double(d) * std::log(double(orig_ctx) / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

}  // namespace

YarnFrequencies yarn_frequencies(const RopeYarn& y, int64_t n_rot, double base) {
  double lo = correction_dim(y.beta_fast, n_rot, base, y.orig_ctx);
  double hi = correction_dim(y.beta_slow, n_rot, base, y.orig_ctx);
  if (y.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, double(n_rot - 1));
  if (lo == hi) hi += 0.001;  // HF linear_ramp_factor: "Prevent singularity"
  YarnFrequencies fr;
  fr.inv_freq.resize(size_t(n_rot / 2));
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double extrapolation = 1.0 / std::pow(base, double(2 * i) / double(n_rot));
    const double interpolation = extrapolation / y.factor;
    const double ramp = std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    fr.inv_freq[size_t(i)] =
        interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  fr.mscale = y.factor <= 1.0 ? 1.0 : 0.1 * std::log(y.factor) + 1.0;
  return fr;
}

void rope_with_frequencies(float* v, int64_t n_rot, int32_t pos, const YarnFrequencies& fr,
                           bool neox) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = double(pos) * fr.inv_freq[size_t(i)];
    const double c = std::cos(theta) * fr.mscale, s = std::sin(theta) * fr.mscale;
    const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const double x0 = v[a], x1 = v[b];
    v[a] = static_cast<float>(x0 * c - x1 * s);
    v[b] = static_cast<float>(x0 * s + x1 * c);
  }
}

}  // namespace touchstone::ops
