// kernels_hwy-inl.h - per-target helpers the cpu_simd kernel files share,
// included once per Highway target by each of them (after hwy/highway.h).
// Per-target include guard: Highway's toggle pattern (hwy/highway.h).
#if defined(TS_CPU_SIMD_KERNELS_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TS_CPU_SIMD_KERNELS_HWY_INL_H_
#undef TS_CPU_SIMD_KERNELS_HWY_INL_H_
#else
#define TS_CPU_SIMD_KERNELS_HWY_INL_H_
#endif

#include <stddef.h>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace touchstone::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four vector accumulators over i = 4*N*k + j*N, then (a0+a1)+(a2+a3), then a
// lane reduction, then the scalar tail in order.
HWY_INLINE float DotLanes(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * N), hn::LoadU(df, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * N), hn::LoadU(df, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float r = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

}  // namespace HWY_NAMESPACE
}  // namespace touchstone::cpu_simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
