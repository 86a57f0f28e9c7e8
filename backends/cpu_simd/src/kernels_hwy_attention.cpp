// kernels_hwy_attention.cpp - fp32 attention kernels (kernels.h: attend_f32,
// attend_multi_f32), compiled once per Highway target (foreach_target) and
// dispatched at run time (HWY_DYNAMIC_DISPATCH).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels_hwy_attention.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// after highway.h (per-target -inl header):
#include "hwy/contrib/math/math-inl.h"
#include "kernels_hwy-inl.h"

#include <string.h>

#include <cmath>

#include "kernels.h"

HWY_BEFORE_NAMESPACE();
namespace touchstone::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- attention (see kernels.h: attend_f32 / attend_multi_f32) ----
// p_t = exp(s_t - mx) in place over s[0, n), N lanes at a time; the tail through
// a padded copy whose pad lanes hold -200 (hn::Exp gives 0 below -104) and are
// not stored back. Returns 1 / (lane-wise sum, then SumOfLanes, then + sink_p).
template <class D>
HWY_INLINE float ExpInPlace(D df, float* HWY_RESTRICT s, size_t n, float mx, float sink_p) {
  const size_t N = hn::Lanes(df);
  const auto vmx = hn::Set(df, mx);
  auto vsum = hn::Zero(df);
  size_t t = 0;
  for (; t + N <= n; t += N) {
    const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, s + t), vmx));
    hn::StoreU(p, df, s + t);
    vsum = hn::Add(vsum, p);
  }
  if (t < n) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
    for (size_t i = 0; i < N; ++i) tail[i] = t + i < n ? s[t + i] - mx : -200.0f;
    const auto p = hn::Exp(df, hn::Load(df, tail));
    hn::Store(p, df, tail);
    for (size_t i = 0; t + i < n; ++i) s[t + i] = tail[i];
    vsum = hn::Add(vsum, p);  // exp(-200) = 0 in fp32
  }
  return 1.0f / (hn::GetLane(hn::SumOfLanes(df, vsum)) + sink_p);
}

// An attention sink's term of the softmax's denominator, exp(sink - mx) (gpt-oss; HF
// eager_attention_forward: the sink column joins the max and the sum, then is dropped);
// exactly 0 without a sink (sink = -inf), which leaves the sum's bits unchanged.
HWY_INLINE float SinkTerm(float sink, float mx) {
  return sink == -HUGE_VALF ? 0.0f : std::exp(sink - mx);
}

// Columns [j, hd) past the last full vector: per element the FMA-free scalar
// chain in t order over p[0, n), times inv.
HWY_INLINE void PvTail(const float* HWY_RESTRICT p, const float* HWY_RESTRICT V, size_t ld,
                       size_t j, size_t hd, size_t n, float inv, float* HWY_RESTRICT out) {
  for (; j < hd; ++j) {
    float a = 0.0f;
    for (size_t u = 0; u < n; ++u) a += p[u] * V[u * ld + j];
    out[j] = a * inv;
  }
}

HWY_ATTR void AttendF32(const float* HWY_RESTRICT q, const float* HWY_RESTRICT K,
                        const float* HWY_RESTRICT V, size_t ld, size_t hd, size_t n_kv, float scale,
                        float* HWY_RESTRICT s, float* HWY_RESTRICT out, float sink) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  // scores and their maximum (the sink's logit included)
  float mx = sink;
  bool nan = false;
  for (size_t t = 0; t < n_kv; ++t) {
    s[t] = DotLanes(q, K + t * ld, hd) * scale;
    nan |= s[t] != s[t];
    mx = s[t] > mx ? s[t] : mx;
  }
  if (nan) {  // hn::Exp maps NaN to 0; a NaN score must reach the output instead
    for (size_t j = 0; j < hd; ++j) out[j] = NAN;
    return;
  }
  const float inv = ExpInPlace(df, s, n_kv, mx, SinkTerm(sink, mx));
  // out = (sum_t p_t V_t) * inv: per element the FMA chain in t order, four
  // accumulators of N lanes in registers per pass over the positions.
  const auto vinv = hn::Set(df, inv);
  size_t j = 0;
  for (; j + 4 * N <= hd; j += 4 * N) {
    auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (size_t u = 0; u < n_kv; ++u) {
      const auto p = hn::Set(df, s[u]);
      const float* v = V + u * ld + j;
      a0 = hn::MulAdd(p, hn::LoadU(df, v), a0);
      a1 = hn::MulAdd(p, hn::LoadU(df, v + N), a1);
      a2 = hn::MulAdd(p, hn::LoadU(df, v + 2 * N), a2);
      a3 = hn::MulAdd(p, hn::LoadU(df, v + 3 * N), a3);
    }
    hn::StoreU(hn::Mul(vinv, a0), df, out + j);
    hn::StoreU(hn::Mul(vinv, a1), df, out + j + N);
    hn::StoreU(hn::Mul(vinv, a2), df, out + j + 2 * N);
    hn::StoreU(hn::Mul(vinv, a3), df, out + j + 3 * N);
  }
  for (; j + N <= hd; j += N) {
    auto a = hn::Zero(df);
    for (size_t u = 0; u < n_kv; ++u)
      a = hn::MulAdd(hn::Set(df, s[u]), hn::LoadU(df, V + u * ld + j), a);
    hn::StoreU(hn::Mul(vinv, a), df, out + j);
  }
  PvTail(s, V, ld, j, hd, n_kv, inv, out);
}

// ---- multi-query attention: a tile of QT queries sharing K / V row loads ----
// Query g of a tile attends rows [t0[g], t1[g]); rows [lo, hi) are common to
// all (hi == lo: none). Row t of query g is visited before / inside / after the
// common range in t order, so each query sees AttendF32's operation sequence.
struct TileRange {
  const size_t* t0;
  const size_t* t1;
  size_t lo, hi;
  size_t pre_end(size_t g) const { return t1[g] < lo ? t1[g] : lo; }
};

// r[g] = DotLanes(q[g], k, n) for the QT queries, each K vector loaded once.
template <size_t QT, class D>
HWY_INLINE void DotTile(D df, const float* const* q, const float* HWY_RESTRICT k, size_t n,
                        float* r) {
  const size_t N = hn::Lanes(df);
  hn::Vec<D> a[QT][4];
  for (size_t g = 0; g < QT; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = hn::Zero(df);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto k0 = hn::LoadU(df, k + i), k1 = hn::LoadU(df, k + i + N);
    const auto k2 = hn::LoadU(df, k + i + 2 * N), k3 = hn::LoadU(df, k + i + 3 * N);
    for (size_t g = 0; g < QT; ++g) {
      a[g][0] = hn::MulAdd(hn::LoadU(df, q[g] + i), k0, a[g][0]);
      a[g][1] = hn::MulAdd(hn::LoadU(df, q[g] + i + N), k1, a[g][1]);
      a[g][2] = hn::MulAdd(hn::LoadU(df, q[g] + i + 2 * N), k2, a[g][2]);
      a[g][3] = hn::MulAdd(hn::LoadU(df, q[g] + i + 3 * N), k3, a[g][3]);
    }
  }
  for (; i + N <= n; i += N) {
    const auto k0 = hn::LoadU(df, k + i);
    for (size_t g = 0; g < QT; ++g) a[g][0] = hn::MulAdd(hn::LoadU(df, q[g] + i), k0, a[g][0]);
  }
  for (size_t g = 0; g < QT; ++g)
    r[g] = hn::GetLane(
        hn::SumOfLanes(df, hn::Add(hn::Add(a[g][0], a[g][1]), hn::Add(a[g][2], a[g][3]))));
  for (size_t g = 0; g < QT; ++g)
    for (size_t j = i; j < n; ++j) r[g] += q[g][j] * k[j];
}

// Scores of the tile (query g's at s + g * lds, indexed t - t0[g]), each
// query's maximum in t order from its sink's logit (mx[g] on entry) and whether it
// has a NaN score.
template <size_t QT, class D>
HWY_INLINE void ScoresTile(D df, const float* const* q, const float* HWY_RESTRICT K, size_t ld,
                           size_t hd, const TileRange& R, float scale, float* HWY_RESTRICT s,
                           size_t lds, float* mx, bool* nan) {
  const auto one = [&](size_t g, size_t t, float v) HWY_ATTR {
    float& x = s[g * lds + t - R.t0[g]];
    x = v * scale;
    nan[g] |= x != x;
    mx[g] = x > mx[g] ? x : mx[g];
  };
  for (size_t g = 0; g < QT; ++g) {
    nan[g] = false;
    for (size_t t = R.t0[g]; t < R.pre_end(g); ++t) one(g, t, DotLanes(q[g], K + t * ld, hd));
  }
  for (size_t t = R.lo; t < R.hi; ++t) {
    float r[QT];
    DotTile<QT>(df, q, K + t * ld, hd, r);
    for (size_t g = 0; g < QT; ++g) one(g, t, r[g]);
  }
  for (size_t g = 0; g < QT; ++g)
    for (size_t t = R.hi; t < R.t1[g]; ++t) one(g, t, DotLanes(q[g], K + t * ld, hd));
}

// out[g][j, j + C*N) = (sum_t p_t V_t) * inv[g]: C accumulators per query, FMAs
// in t order; V vectors of the common rows loaded once for the tile.
template <size_t QT, size_t C, class D>
HWY_INLINE void PvTile(D df, const float* HWY_RESTRICT V, size_t ld, size_t j, const TileRange& R,
                       const float* HWY_RESTRICT s, size_t lds, const float* inv,
                       float* const* out) {
  const size_t N = hn::Lanes(df);
  hn::Vec<D> a[QT][C];
  const auto rows = [&](size_t g, size_t u0, size_t u1) HWY_ATTR {
    for (size_t u = u0; u < u1; ++u) {
      const auto p = hn::Set(df, s[g * lds + u - R.t0[g]]);
      for (size_t c = 0; c < C; ++c)
        a[g][c] = hn::MulAdd(p, hn::LoadU(df, V + u * ld + j + c * N), a[g][c]);
    }
  };
  for (size_t g = 0; g < QT; ++g) {
    for (size_t c = 0; c < C; ++c) a[g][c] = hn::Zero(df);
    rows(g, R.t0[g], R.pre_end(g));
  }
  for (size_t u = R.lo; u < R.hi; ++u) {
    hn::Vec<D> v[C];
    for (size_t c = 0; c < C; ++c) v[c] = hn::LoadU(df, V + u * ld + j + c * N);
    for (size_t g = 0; g < QT; ++g) {
      const auto p = hn::Set(df, s[g * lds + u - R.t0[g]]);
      for (size_t c = 0; c < C; ++c) a[g][c] = hn::MulAdd(p, v[c], a[g][c]);
    }
  }
  for (size_t g = 0; g < QT; ++g) {
    rows(g, R.hi, R.t1[g]);
    const auto vinv = hn::Set(df, inv[g]);
    for (size_t c = 0; c < C; ++c) hn::StoreU(hn::Mul(vinv, a[g][c]), df, out[g] + j + c * N);
  }
}

// Register tiles: 4 queries x 4 vectors with 32 vector registers (AVX-512),
// 2 x 4 otherwise.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr size_t kAttnTile = 4;
#else
constexpr size_t kAttnTile = 2;
#endif

template <size_t QT>
HWY_ATTR void AttendTile(const float* const* q, const float* HWY_RESTRICT K,
                         const float* HWY_RESTRICT V, size_t ld, size_t hd, const size_t* t0,
                         const size_t* t1, float scale, float* HWY_RESTRICT s, size_t lds,
                         float* const* out, const float* sinks) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  TileRange R{t0, t1, t0[0], t1[0]};
  for (size_t g = 1; g < QT; ++g) {
    R.lo = t0[g] > R.lo ? t0[g] : R.lo;
    R.hi = t1[g] < R.hi ? t1[g] : R.hi;
  }
  if (R.hi < R.lo) R.hi = R.lo;
  float mx[QT], sink[QT], inv[QT];
  bool nan[QT];
  for (size_t g = 0; g < QT; ++g) mx[g] = sink[g] = sinks ? sinks[g] : -HUGE_VALF;
  ScoresTile<QT>(df, q, K, ld, hd, R, scale, s, lds, mx, nan);
  for (size_t g = 0; g < QT; ++g)
    inv[g] =
        nan[g] ? 0.0f : ExpInPlace(df, s + g * lds, t1[g] - t0[g], mx[g], SinkTerm(sink[g], mx[g]));
  size_t j = 0;
  for (; j + 4 * N <= hd; j += 4 * N) PvTile<QT, 4>(df, V, ld, j, R, s, lds, inv, out);
  for (; j + N <= hd; j += N) PvTile<QT, 1>(df, V, ld, j, R, s, lds, inv, out);
  for (size_t g = 0; g < QT; ++g) {
    if (nan[g]) {  // as AttendF32: a NaN score makes the whole output NaN
      for (size_t i = 0; i < hd; ++i) out[g][i] = NAN;
      continue;
    }
    PvTail(s + g * lds, V + t0[g] * ld, ld, j, hd, t1[g] - t0[g], inv[g], out[g]);
  }
}

HWY_ATTR void AttendMultiF32(size_t G, const float* const* q, const float* HWY_RESTRICT K,
                             const float* HWY_RESTRICT V, size_t ld, size_t hd, const size_t* t0,
                             const size_t* t1, float scale, float* HWY_RESTRICT s, size_t lds,
                             float* const* out, const float* sinks) {
  size_t g = 0;
  // the sinks of queries [g, ...) (none: nullptr)
  const auto sk = [&](size_t at) { return sinks ? sinks + at : nullptr; };
  for (; g + kAttnTile <= G; g += kAttnTile)
    AttendTile<kAttnTile>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g,
                          sk(g));
  // the rest (fewer than kAttnTile queries) in one tile
  const size_t r = G - g;
  if (kAttnTile > 3 && r == 3)
    AttendTile<3>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g, sk(g));
  else if (kAttnTile > 2 && r == 2)
    AttendTile<2>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g, sk(g));
  else if (r == 1)
    AttendTile<1>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g, sk(g));
}

}  // namespace HWY_NAMESPACE
}  // namespace touchstone::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace touchstone::cpu_simd {
HWY_EXPORT(AttendF32);
HWY_EXPORT(AttendMultiF32);

void attend_f32(const float* q, const float* K, const float* V, size_t ld, size_t hd, size_t n_kv,
                float scale, float* scores, float* out, float sink) {
  HWY_DYNAMIC_DISPATCH(AttendF32)(q, K, V, ld, hd, n_kv, scale, scores, out, sink);
}
void attend_multi_f32(size_t G, const float* const* q, const float* K, const float* V, size_t ld,
                      size_t hd, const size_t* t0, const size_t* t1, float scale, float* scores,
                      size_t ld_scores, float* const* out, const float* sinks) {
  HWY_DYNAMIC_DISPATCH(AttendMultiF32)
  (G, q, K, V, ld, hd, t0, t1, scale, scores, ld_scores, out, sinks);
}
}  // namespace touchstone::cpu_simd
#endif
