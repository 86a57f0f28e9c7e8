// engine_ops.h - small scalar helpers shared by the engine's translation units
// (engine.cpp, engine_pass.cpp, engine_attention.cpp, engine_batch.cpp, engine_moe.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace touchstone::cpu_simd::ops {

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// out = x / sqrt(mean(x^2) + eps) * w, fp64 sum like the reference.
inline void rms_norm(const float* x, const float* w, float* out, size_t n, double eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += double{x[i]} * double{x[i]};
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(double{x[i]} * inv * double{w[i]});
}

// x += b (Q/K/V biases of Qwen2 and gpt-oss; gpt-oss's output, router and expert
// biases). fp32 sum of the rounded matmul output and the bias; the reference adds
// the bias to the fp64 dot product before its one rounding, so the two differ by at
// most one extra rounding.
inline void add_bias(float* x, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += b[i];
}

}  // namespace touchstone::cpu_simd::ops
