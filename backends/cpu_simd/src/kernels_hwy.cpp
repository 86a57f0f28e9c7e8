// kernels_hwy.cpp - fp32 kernels, compiled once per Highway target
// (foreach_target) and dispatched at run time (HWY_DYNAMIC_DISPATCH).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// after highway.h (per-target -inl header):
#include "hwy/contrib/math/math-inl.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"

#ifndef TS_CPU_H2F_EXACT
#define TS_CPU_H2F_EXACT
namespace touchstone::cpu_simd {
inline float h2f_exact(uint16_t h) { return touchstone::gguf::fp16_to_fp32(h); }
}  // namespace touchstone::cpu_simd
#endif

#ifndef TS_CPU_KERNELS_HWY_ONCE
#define TS_CPU_KERNELS_HWY_ONCE
namespace touchstone::cpu_simd {
// The scalar form of gated_act_f64 (lanes outside the vector range): the
// reference's own functions (std::tanh / std::exp).
inline float ScalarGatedAct(bool gelu, float g, float u) {
  const double x = g;
  const double act = gelu ? touchstone::ops::gelu_tanh(x) : touchstone::ops::silu(x);
  return static_cast<float>(act * double{u});
}
// The ggml types (touchstone::gguf::TensorType) of the blocks these kernels read.
inline constexpr int kQ4_0 = int(gguf::TensorType::Q4_0), kQ4_1 = int(gguf::TensorType::Q4_1),
                     kQ5_0 = int(gguf::TensorType::Q5_0), kQ8_0 = int(gguf::TensorType::Q8_0),
                     kQ4_K = int(gguf::TensorType::Q4_K), kQ6_K = int(gguf::TensorType::Q6_K);
// 32-element GGUF blocks (Q4_0, Q4_1, Q5_0, Q8_0): bytes per block and offset of
// the quants (after the fp16 d, m / qh fields).
constexpr size_t Block32Bytes(int type) {
  return type == kQ4_0 ? 18 : type == kQ4_1 ? 20 : type == kQ5_0 ? 22 : 34;
}
constexpr size_t Block32QsOffset(int type) { return type == kQ4_1 ? 4 : type == kQ5_0 ? 6 : 2; }
}  // namespace touchstone::cpu_simd
#endif

HWY_BEFORE_NAMESPACE();
namespace touchstone::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four vector accumulators over i = 4*N*k + j*N, then (a0+a1)+(a2+a3), then a
// lane reduction, then the scalar tail in order.
HWY_ATTR float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
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

HWY_ATTR void MatvecF32(const float* HWY_RESTRICT W, size_t ld, const float* HWY_RESTRICT x,
                        float* HWY_RESTRICT y, size_t n_rows, size_t n) {
  for (size_t r = 0; r < n_rows; ++r) y[r] = DotF32(W + r * ld, x, n);
}

HWY_ATTR void AxpyF32(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto va = hn::Set(df, alpha);
  size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

HWY_ATTR void ScaleF32(float alpha, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto va = hn::Set(df, alpha);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(va, hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] *= alpha;
}

// ---- attention (see kernels.h: attend_f32 / attend_multi_f32) ----
// p_t = exp(s_t - mx) in place over s[0, n), N lanes at a time; the tail through
// a padded copy whose pad lanes hold -200 (hn::Exp gives 0 below -104) and are
// not stored back. Returns 1 / (lane-wise sum, then SumOfLanes).
template <class D>
HWY_INLINE float ExpInPlace(D df, float* HWY_RESTRICT s, size_t n, float mx) {
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
  return 1.0f / hn::GetLane(hn::SumOfLanes(df, vsum));
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
                        float* HWY_RESTRICT s, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  // scores and their maximum
  float mx = -HUGE_VALF;
  bool nan = false;
  for (size_t t = 0; t < n_kv; ++t) {
    s[t] = DotF32(q, K + t * ld, hd) * scale;
    nan |= s[t] != s[t];
    mx = s[t] > mx ? s[t] : mx;
  }
  if (nan) {  // hn::Exp maps NaN to 0; a NaN score must reach the output instead
    for (size_t j = 0; j < hd; ++j) out[j] = NAN;
    return;
  }
  const float inv = ExpInPlace(df, s, n_kv, mx);
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

// r[g] = DotF32(q[g], k, n) for the QT queries, each K vector loaded once.
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
// query's maximum in t order and whether it has a NaN score.
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
    mx[g] = -HUGE_VALF;
    nan[g] = false;
    for (size_t t = R.t0[g]; t < R.pre_end(g); ++t) one(g, t, DotF32(q[g], K + t * ld, hd));
  }
  for (size_t t = R.lo; t < R.hi; ++t) {
    float r[QT];
    DotTile<QT>(df, q, K + t * ld, hd, r);
    for (size_t g = 0; g < QT; ++g) one(g, t, r[g]);
  }
  for (size_t g = 0; g < QT; ++g)
    for (size_t t = R.hi; t < R.t1[g]; ++t) one(g, t, DotF32(q[g], K + t * ld, hd));
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
                         float* const* out) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  TileRange R{t0, t1, t0[0], t1[0]};
  for (size_t g = 1; g < QT; ++g) {
    R.lo = t0[g] > R.lo ? t0[g] : R.lo;
    R.hi = t1[g] < R.hi ? t1[g] : R.hi;
  }
  if (R.hi < R.lo) R.hi = R.lo;
  float mx[QT], inv[QT];
  bool nan[QT];
  ScoresTile<QT>(df, q, K, ld, hd, R, scale, s, lds, mx, nan);
  for (size_t g = 0; g < QT; ++g)
    inv[g] = nan[g] ? 0.0f : ExpInPlace(df, s + g * lds, t1[g] - t0[g], mx[g]);
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
                             float* const* out) {
  size_t g = 0;
  for (; g + kAttnTile <= G; g += kAttnTile)
    AttendTile<kAttnTile>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g);
  // the rest (fewer than kAttnTile queries) in one tile
  const size_t r = G - g;
  if (kAttnTile > 3 && r == 3)
    AttendTile<3>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g);
  else if (kAttnTile > 2 && r == 2)
    AttendTile<2>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g);
  else if (r == 1)
    AttendTile<1>(q + g, K, V, ld, hd, t0 + g, t1 + g, scale, s + g * lds, lds, out + g);
}

// ---- GGUF blocks x fp32 activations (weights dequantized in registers) ----
// Element i of a block: Q4: low nibble of qs[i] (i < 16) / high nibble of
// qs[i - 16]; Q8_0: qs[i]. The weight is formed exactly as ggml's
// dequantize_row_* (and touchstone::gguf::dequantize_row) does, in fp32:
//   Q4_0: float(q - 8) * d    Q4_1: float(q) * d + m (no FMA)    Q8_0: float(q) * d
//   Q5_0 (T = 6, reached through gemm_blocks_f32): float((nibble | qh bit << 4) - 16) * d
// so this computes the same products as the full-precision path; only the
// fp32 summation order differs.
HWY_INLINE float H2F(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX2)
  // F16C vcvtph2ps: exact for every half (normal, subnormal, inf, nan).
  return _cvtsh_ss(h);
#endif
  if ((h & 0x7c00u) == 0x7c00u) return h2f_exact(h);  // inf / nan
  const uint32_t mag = uint32_t(h & 0x7fffu) << 13;
  float f;
  memcpy(&f, &mag, 4);
  f *= 5.192296858534828e+33f;  // 2^112: exact for normal and subnormal halves
  return (h & 0x8000u) ? -f : f;
}

#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX2)
// The first 4 bytes of the blocks of NR (<= 4) rows as two fp16 each, converted
// to fp32 in one vcvtph2ps: lanes 2r, 2r+1 = row r's (d, m) (Q4_1) / (d, junk)
// (Q4_0). Built in registers (vmovd loads, unpacks): narrow stores read back by
// one wide load miss store forwarding (~15 cycles more latency per block).
template <int NR>
HWY_INLINE __m256 BlockHeadsF32(const uint8_t* const* blk) {
  auto ld = [blk](int r) {
    int32_t v;
    memcpy(&v, blk[r], 4);
    return _mm_cvtsi32_si128(v);
  };
  __m128i lo = ld(0), hi = _mm_setzero_si128();
  if constexpr (NR > 1) lo = _mm_unpacklo_epi32(lo, ld(1));
  if constexpr (NR > 2) hi = ld(2);
  if constexpr (NR > 3) hi = _mm_unpacklo_epi32(hi, ld(3));
  return _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi));
}
#endif

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2)
// AVX2, Q4_0 / Q4_1, one block of NR rows x NT tokens (see QTile). Per row two
// vpmovzxbd (bytes 0-7 and 8-15 of qs: their low nibbles are elements 0-15,
// their high nibbles elements 16-31) instead of one per 8 weights; the NR rows'
// fp16 scales in one vcvtph2ps, stored and read back as vbroadcastss loads
// (load ports, not the shuffle port); one FMA per 8 weights:
//   Q4_1: float(q)*d + m     (q*d is exact in fp32, so the FMA's single rounding
//                             equals ggml's multiply-then-add)
//   Q4_0: float(q)*d + (-8d) (q*d, -8d and their sum (q-8)*d are all exact, so
//                             this is float(q-8)*d bit for bit)
// The four 8-lane chunks are FMA'd into each accumulator in element order, as
// the generic loop does, so every output gets the same bits as before.
template <int T, int NR, int NT>
HWY_ATTR HWY_INLINE void Q4BlockAVX2(const uint8_t* const* qs, const float* HWY_RESTRICT x,
                                     size_t ldx, hn::Vec<hn::ScalableTag<float>> (&acc)[NR][NT]) {
  constexpr size_t off = Block32QsOffset(T);
  const uint8_t* blk[NR];
  for (int r = 0; r < NR; ++r) blk[r] = qs[r] - off;
  __m256 s = BlockHeadsF32<NR>(blk);  // [d_r, m_r] / [d_r, junk]
  if constexpr (T == kQ4_0)
    s = _mm256_mul_ps(_mm256_moveldup_ps(s), _mm256_setr_ps(1, -8, 1, -8, 1, -8, 1, -8));
  alignas(32) float sc[8];  // [d_r, m_r] (Q4_1) / [d_r, -8 d_r] (Q4_0) per row r
  _mm256_store_ps(sc, s);
  asm volatile("" : : "m"(sc) : "memory");  // reload as vbroadcastss from memory
  const __m256i lo4 = _mm256_set1_epi32(0x0f);
  __m256i z[NR][2];
  for (int r = 0; r < NR; ++r) {
    for (int h = 0; h < 2; ++h) {
      z[r][h] =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs[r] + 8 * h)));
    }
  }
  for (int c = 0; c < 4; ++c) {  // elements 8c .. 8c+7
    __m256 w[NR];
    for (int r = 0; r < NR; ++r) {
      const __m256i q = c < 2 ? _mm256_and_si256(z[r][c], lo4) : _mm256_srli_epi32(z[r][c - 2], 4);
      w[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_broadcast_ss(sc + 2 * r),
                             _mm256_broadcast_ss(sc + 2 * r + 1));
    }
    for (int t = 0; t < NT; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + size_t(t) * ldx + size_t(8 * c));
      for (int r = 0; r < NR; ++r) acc[r][t].raw = _mm256_fmadd_ps(w[r], xv, acc[r][t].raw);
    }
  }
}
#endif

// Decode prefetches this many bytes ahead of the block it reads.
constexpr size_t kPrefetch = 4096;
using VecF = hn::Vec<hn::ScalableTag<float>>;

#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
// AVX3, Q4_0 / Q4_1, one block of NR rows x NT tokens (see QTile). 16 lanes:
// the block's 16 possible weights in one register, table[k] = float(k) * d + m
// (Q4_1) / float(k - 8) * d (Q4_0), formed exactly as the generic form, then
// one vpermps per 16 weights picks them by nibble.
template <int T, int NR, int NT>
HWY_ATTR HWY_INLINE void Q4BlockAVX3(const uint8_t* const* qs, const float* HWY_RESTRICT x,
                                     size_t ldx, VecF (&acc)[NR][NT]) {
  const hn::ScalableTag<float> df;
  constexpr size_t off = Block32QsOffset(T);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i nib[NR];
  __m512 table[NR];
  // The NR rows' fp16 (d, m) (Q4_1) or d (Q4_0) in one vcvtph2ps, kept as
  // fp32 in memory so that the table FMA reads them as embedded
  // broadcasts ({1to16}) instead of shuffle-port broadcasts.
  const uint8_t* blk[NR];
  for (int r = 0; r < NR; ++r) blk[r] = qs[r] - off;
  alignas(32) float sc[8];  // [d_r, m_r] (Q4_1) / [d_r, junk] (Q4_0) per row r
  _mm256_store_ps(sc, BlockHeadsF32<NR>(blk));
  asm volatile("" : : "m"(sc) : "memory");  // reload: vbroadcastss from memory, not a shuffle
  for (int r = 0; r < NR; ++r) {
    nib[r] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs[r])));
    if constexpr (T == kQ4_0) {
      table[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(8))),
                               _mm512_set1_ps(sc[2 * r]));
    } else {
      // k * d is exact in fp32 (k < 16, d has an 11-bit significand), so
      // the single rounding of the FMA equals ggml's mul-then-add.
      table[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iota), _mm512_set1_ps(sc[2 * r]),
                                 _mm512_set1_ps(sc[2 * r + 1]));
    }
  }
  for (int half = 0; half < 2; ++half) {
    VecF w[NR];
    for (int r = 0; r < NR; ++r) {
      // vpermps reads the low 4 bits of each index lane: the low nibble as is.
      const __m512i idx = half == 0 ? nib[r] : _mm512_srli_epi32(nib[r], 4);
      w[r].raw = _mm512_permutexvar_ps(idx, table[r]);
    }
    for (int t = 0; t < NT; ++t) {
      const auto xv = hn::LoadU(df, x + size_t(t) * ldx + size_t(half) * 16);
      for (int r = 0; r < NR; ++r) acc[r][t] = hn::MulAdd(w[r], xv, acc[r][t]);
    }
  }
}
#endif

// One block of NR rows x NT tokens, any 32-element type, N lanes at a time:
// each weight formed as ggml's dequantize_row_* does (d[r], m[r]: the rows'
// scales as vectors; qh[r]: Q5_0's high bits), one MulAdd per weight vector
// and token.
template <int T, int NR, int NT>
HWY_ATTR HWY_INLINE void QBlockLanes(const uint8_t* const* qs, const uint32_t* qh, const VecF* d,
                                     const VecF* m, const float* HWY_RESTRICT x, size_t ldx,
                                     VecF (&acc)[NR][NT]) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t N = hn::Lanes(df);
  const auto mask = hn::Set(di, 0x0f);
  for (size_t j = 0; j < 32; j += N) {
    VecF w[NR];
    for (int r = 0; r < NR; ++r) {
      if constexpr (T == kQ8_0) {
        w[r] = hn::Mul(
            hn::ConvertTo(
                df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(qs[r]) + j))),
            d[r]);
      } else if constexpr (T == kQ5_0) {
        // ggml dequantize_row_q5_0: q = nibble | bit i of qh << 4; float(q - 16) * d
        const auto nib = hn::PromoteTo(du, hn::LoadU(du8, qs[r] + (j & 15)));
        const auto lo = j < 16 ? hn::And(nib, hn::Set(du, 0x0f)) : hn::ShiftRight<4>(nib);
        const auto hi = hn::And(hn::Set(du, qh[r]) >> hn::Iota(du, uint32_t(j)), hn::Set(du, 1));
        const auto q = hn::BitCast(di, hn::Or(lo, hn::ShiftLeft<4>(hi)));
        w[r] = hn::Mul(hn::ConvertTo(df, hn::Sub(q, hn::Set(di, 16))), d[r]);
      } else {
        const auto raw = hn::BitCast(di, hn::PromoteTo(du, hn::LoadU(du8, qs[r] + (j & 15))));
        const auto q = j < 16 ? hn::And(raw, mask) : hn::ShiftRight<4>(raw);
        if constexpr (T == kQ4_0) {
          w[r] = hn::Mul(hn::ConvertTo(df, hn::Sub(q, hn::Set(di, 8))), d[r]);
        } else {
          w[r] = hn::Add(hn::Mul(hn::ConvertTo(df, q), d[r]), m[r]);
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      const auto xv = hn::LoadU(df, x + size_t(t) * ldx + j);
      for (int r = 0; r < NR; ++r) acc[r][t] = hn::MulAdd(w[r], xv, acc[r][t]);
    }
  }
}

// One register tile: NR weight rows x NT tokens. Every (row, token) output has
// its own accumulator vector and sees exactly the same operation sequence
// (blocks in order, N-lane chunks in order, one FMA each, then SumOfLanes)
// whatever NR and NT are, so results never depend on the tiling (prefill ==
// decode bitwise, thread-count independence). NR > 1 gives decode several
// independent FMA chains and memory streams; NT > 1 reuses each dequantized
// weight vector for NT tokens (prefill).
template <int T, int NR, int NT>
HWY_ATTR HWY_INLINE void QTile(const uint8_t* HWY_RESTRICT row, size_t row_bytes, size_t nb,
                               const float* HWY_RESTRICT x, size_t ldx, float* HWY_RESTRICT out,
                               size_t ldo) {
  const hn::ScalableTag<float> df;
  constexpr size_t bb = Block32Bytes(T), off = Block32QsOffset(T);
  VecF acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = hn::Zero(df);
  for (size_t b = 0; b < nb; ++b) {
    VecF d[NR], m[NR];
    const uint8_t* qs[NR];
    uint32_t qh[NR] = {};  // Q5_0: the 32 high bits
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = row + size_t(r) * row_bytes + b * bb;
      // Decode streams the weights from DRAM once: prefetch ahead (NR row
      // streams, each line once per 64 bytes of blocks).
      if (NT == 1 && (b * bb) % 64 < bb) __builtin_prefetch(blk + kPrefetch);
      d[r] = hn::Set(df, H2F(blk));
      m[r] = hn::Set(df, T == kQ4_1 ? H2F(blk + 2) : 0.0f);
      qs[r] = blk + off;
      if constexpr (T == kQ5_0) memcpy(&qh[r], blk + 2, 4);
    }
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
    if constexpr (T == kQ4_0 || T == kQ4_1) {
      Q4BlockAVX3<T, NR, NT>(qs, x + b * 32, ldx, acc);
      continue;
    }
#endif
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2)
    // Q4_0 decode (NT == 1) measured ~13% slower this way than lane by lane
    // (touchstone_cpu_simd_kernels_bench, Intel Xeon host, 2026-11-26; cause
    // not found), so it keeps the generic code; same bits either way.
    if constexpr (T == kQ4_1 || (T == kQ4_0 && NT > 1)) {
      Q4BlockAVX2<T, NR, NT>(qs, x + b * 32, ldx, acc);
      continue;
    }
#endif
    QBlockLanes<T, NR, NT>(qs, qh, d, m, x + b * 32, ldx, acc);
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t)
      out[size_t(t) * ldo + size_t(r)] = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
}

// Rows [r0, r1) x tokens [0, n_tok): tiles of kPR rows x kPT tokens (prefill),
// then the remaining tokens one at a time in tiles of kDR rows (decode), row
// tails one row at a time.
// AVX3 has 32 vector registers: 4 x 4 accumulators; the 16-register targets
// (AVX2, SSE4, ...) would spill those, so they take 1 row x 8 tokens (the
// activations are FMA memory operands), and decode tiles of 2 rows (4 spilled
// on AVX2: SmolLM2 decode 67 -> 81 tok/s, 1 thread). Prefill of 8 tokens or
// more goes through the panels instead (GemmQF32). The tile shape never
// changes results.
template <int T>
HWY_ATTR void GemmQF32T(const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
                        const float* X, size_t ldx, size_t n_tok, float* Y, size_t ldy) {
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
  constexpr int kPR = 4, kPT = 4, kDR = 4;
#else
  constexpr int kPR = 1, kPT = 8, kDR = 2;
#endif
  size_t t = 0;
  for (; t + kPT <= n_tok; t += kPT) {
    size_t r = r0;
    for (; r + kPR <= r1; r += kPR)
      QTile<T, kPR, kPT>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r, ldy);
    for (; r < r1; ++r)
      QTile<T, 1, kPT>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r, ldy);
  }
  for (; t < n_tok; ++t) {
    size_t r = r0;
    for (; r + kDR <= r1; r += kDR)
      QTile<T, kDR, 1>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r, ldy);
    for (; r < r1; ++r)
      QTile<T, 1, 1>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r, ldy);
  }
}

#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX2)
// A Q5_0 block {fp16 d; u8 qh[4]; u8 qs[16]} as 32 signed bytes q - 16 in
// element order, exactly ggml's ((nibble | qh bit i << 4) - 16): the low
// nibbles of qs are elements 0-15, the high nibbles 16-31, bit i of qh is
// element i's fifth bit (llama.cpp's bytes_from_bits_32: each byte i keeps
// bit i of its copy of qh and sets all the others, so it is 0xff iff bit i is set).
HWY_INLINE __m256i Q5Bytes(const uint8_t* blk) {
  uint32_t qh;
  memcpy(&qh, blk + 2, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int32_t(qh)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_cmpeq_epi8(
      _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
  const __m256i nib = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(qs), _mm_srli_epi16(qs, 4), 1),
      _mm256_set1_epi8(0x0f));
  const __m256i q = _mm256_or_si256(nib, _mm256_and_si256(bit, _mm256_set1_epi8(0x10)));
  return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
}
#endif

// Q4_0 / Q4_1 blocks with 16 fp32 lanes (AVX3): a 4-bit block has 16
// possible values, each formed exactly as the per-element form below does
// (float(k - 8) * d, float(k) * d + m: the same operations on the same
// inputs, so the same bits), then looked up per nibble (one permute instead
// of a convert, a multiply and an add per vector).
template <class DF>
HWY_ATTR HWY_INLINE void DequantQ4Table(DF df, int type, const uint8_t* src, float* y, size_t nb) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t bb = Block32Bytes(type), off = Block32QsOffset(type);
  const auto k = hn::ConvertTo(df, hn::Sub(hn::Iota(di, 0), hn::Set(di, type == kQ4_0 ? 8 : 0)));
  for (size_t i = 0; i < nb; ++i, src += bb, y += 32) {
    // The rows stream from memory once per call: prefetch ahead, once per line.
    if ((i * bb) % 64 < bb) __builtin_prefetch(src + kPrefetch);
    const auto d = hn::Set(df, H2F(src));
    const auto table =
        type == kQ4_1 ? hn::Add(hn::Mul(k, d), hn::Set(df, H2F(src + 2))) : hn::Mul(k, d);
    const auto raw = hn::PromoteTo(du, hn::LoadU(du8, src + off));
    const auto lo = hn::BitCast(di, hn::And(raw, hn::Set(du, 0x0f)));
    const auto hi = hn::BitCast(di, hn::ShiftRight<4>(raw));
    hn::StoreU(hn::TableLookupLanes(table, hn::IndicesFromVec(df, lo)), df, y);
    hn::StoreU(hn::TableLookupLanes(table, hn::IndicesFromVec(df, hi)), df, y + 16);
  }
}

#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX2)
// Q5_0 with byte operations (Q5Bytes): ~0.5 instead of ~1.25 ops per weight.
HWY_ATTR HWY_INLINE void DequantQ5AVX2(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += 22, y += 32) {
    __builtin_prefetch(src + kPrefetch);  // decode streams the rows from memory once
    const __m256 d = _mm256_set1_ps(H2F(src));
    const __m256i q = Q5Bytes(src);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int c = 0; c < 4; ++c) {
      const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[c]));
      _mm256_storeu_ps(y + 8 * c, _mm256_mul_ps(w, d));
    }
  }
}
#endif

// The 32-element types (Q4_0, Q4_1, Q5_0, Q8_0), N <= 16 lanes at a time.
HWY_ATTR HWY_INLINE void Dequant32(int type, const uint8_t* src, float* y, size_t nb) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const size_t N = hn::Lanes(df);
  const size_t bb = Block32Bytes(type), off = Block32QsOffset(type);
  for (size_t i = 0; i < nb; ++i, src += bb, y += 32) {
    if ((i * bb) % 64 < bb) __builtin_prefetch(src + kPrefetch);
    const auto d = hn::Set(df, H2F(src));
    const auto m = hn::Set(df, type == kQ4_1 ? H2F(src + 2) : 0.0f);
    uint32_t qh = 0;  // Q5_0: bit i is element i's fifth bit
    if (type == kQ5_0) memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + off;
    for (size_t l = 0; l < 32; l += N) {
      hn::Vec<decltype(df)> w;
      if (type == kQ8_0) {
        const auto q = hn::LoadU(di8, reinterpret_cast<const int8_t*>(qs) + l);
        w = hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, q)), d);
      } else {
        const auto raw = hn::PromoteTo(du, hn::LoadU(du8, qs + (l & 15)));
        auto q = l < 16 ? hn::And(raw, hn::Set(du, 0x0f)) : hn::ShiftRight<4>(raw);
        if (type == kQ5_0) {
          const auto hi = hn::And(hn::Set(du, qh) >> hn::Iota(du, uint32_t(l)), hn::Set(du, 1));
          q = hn::Or(q, hn::ShiftLeft<4>(hi));
        }
        const auto qi = hn::BitCast(di, q);
        if (type == kQ4_1) {
          w = hn::Add(hn::Mul(hn::ConvertTo(df, qi), d), m);
        } else {
          w = hn::Mul(hn::ConvertTo(df, hn::Sub(qi, hn::Set(di, type == kQ4_0 ? 8 : 16))), d);
        }
      }
      hn::StoreU(w, df, y + l);
    }
  }
}

// Q4_K: {d, dmin, scales[12], qs[128]} = 144 bytes per 256 elements.
HWY_ATTR HWY_INLINE void DequantQ4K(const uint8_t* src, float* y, size_t nb) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < nb; ++i, src += 144) {
    for (size_t l = 0; l < 144; l += 64) __builtin_prefetch(src + kPrefetch + l);
    const float d = H2F(src), dmin = H2F(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
      for (int h = 0; h < 2; ++h) {
        const int k = is + h;
        const uint8_t sc = k < 4 ? uint8_t(scales[k] & 63)
                                 : uint8_t((scales[k + 4] & 0xF) | ((scales[k - 4] >> 6) << 4));
        const uint8_t m = k < 4 ? uint8_t(scales[k + 4] & 63)
                                : uint8_t((scales[k + 4] >> 4) | ((scales[k] >> 6) << 4));
        const auto d1 = hn::Set(df, d * float(sc)), m1 = hn::Set(df, dmin * float(m));
        for (size_t l = 0; l < 32; l += N) {
          const auto raw = hn::PromoteTo(du, hn::LoadU(du8, q + l));
          const auto v = h == 0 ? hn::And(raw, hn::Set(du, 0x0f)) : hn::ShiftRight<4>(raw);
          hn::StoreU(hn::Sub(hn::Mul(d1, hn::ConvertTo(df, hn::BitCast(di, v))), m1), df,
                     y + size_t(h) * 32 + l);
        }
      }
      y += 64;
    }
  }
}

// Q6_K: {ql[128], qh[64], scales[16] (int8), d} = 210 bytes per 256 elements.
HWY_ATTR HWY_INLINE void DequantQ6K(const uint8_t* src, float* y, size_t nb) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < nb; ++i, src += 210) {
    for (size_t l = 0; l < 210; l += 64) __builtin_prefetch(src + kPrefetch + l);
    const float d = H2F(src + 208);
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = src + n * 64;
      const uint8_t* qh = src + 128 + n * 32;
      const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192) + n * 8;
      for (int g = 0; g < 4; ++g) {
        for (size_t l = 0; l < 32; l += N) {
          const float ds = d * float(sc[l / 16 + size_t(2 * g)]);
          const auto qlv = hn::PromoteTo(du, hn::LoadU(du8, ql + l + size_t(g & 1) * 32));
          const auto lo = g < 2 ? hn::And(qlv, hn::Set(du, 0x0f)) : hn::ShiftRight<4>(qlv);
          const auto qhv = hn::PromoteTo(du, hn::LoadU(du8, qh + l));
          const auto hi = hn::And(qhv >> hn::Set(du, uint32_t(2 * g)), hn::Set(du, 3));
          const auto q =
              hn::Sub(hn::BitCast(di, hn::Or(lo, hn::ShiftLeft<4>(hi))), hn::Set(di, 32));
          hn::StoreU(hn::Mul(hn::Set(df, ds), hn::ConvertTo(df, q)), df, y + size_t(g) * 32 + l);
        }
      }
      y += 128;
    }
  }
}

// Q4_K / Q6_K blocks (256 elements) dequantized with vectors, each value
// formed exactly as ggml's dequantize_row_q4_K / _q6_K (and
// touchstone::gguf::dequantize_row) does, same fp32 operations in the same
// order (no FMA: this file is built with -ffp-contract=off):
//   Q4_K: (d * sc) * float(q) - (dmin * m)      Q6_K: (d * sc) * float(q - 32)
// and the 32-element types as dequantize_row_q4_0/_q4_1/_q5_0/_q8_0 do:
//   Q4_0: float(q - 8) * d    Q4_1: float(q) * d + m    Q5_0: float(q - 16) * d
//   Q8_0: float(q) * d
// Other types: the reference routine. Returns false for no vector form.
HWY_ATTR bool DequantBlocksVec(int type, const uint8_t* src, float* y, size_t nb) {
  const hn::ScalableTag<float> df;
  if (hn::Lanes(df) > 16) return false;  // chunks must not straddle a 16-element scale group
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX2)
  if (type == kQ5_0) {
    DequantQ5AVX2(src, y, nb);
    return true;
  }
#endif
  if ((type == kQ4_0 || type == kQ4_1) && hn::Lanes(df) == 16) {
    DequantQ4Table(df, type, src, y, nb);
    return true;
  }
  if (type == kQ4_0 || type == kQ4_1 || type == kQ5_0 || type == kQ8_0) {
    Dequant32(type, src, y, nb);
    return true;
  }
  if (type == kQ4_K) {
    DequantQ4K(src, y, nb);
    return true;
  }
  if (type == kQ6_K) {
    DequantQ6K(src, y, nb);
    return true;
  }
  return false;
}

HWY_ATTR void DequantBlocks(int type, const uint8_t* src, float* y, size_t nb, size_t block_elems,
                            size_t block_bytes) {
  const bool natural = block_elems == (type == kQ4_K || type == kQ6_K ? 256u : 32u);
  if (natural && DequantBlocksVec(type, src, y, nb)) return;
  for (size_t b = 0; b < nb; ++b) {
    touchstone::gguf::dequantize_row(touchstone::gguf::TensorType(type), src + b * block_bytes,
                                     y + b * block_elems, int64_t(block_elems));
  }
}

// ---- Panels: rows dequantized once per call, then register tiles ----
// Each group of kGR rows is dequantized into an fp32 panel (DequantBlocks:
// ggml's values bit for bit), then tiles of kGR rows x kGT tokens read it.
// Per output the operation sequence is QTile's (zero; blocks in order, N-lane
// chunks in order, one MulAdd each; SumOfLanes), so the results are bitwise
// those of QTile and of decode. What changes is the cost: the dequantization
// is paid once per row and call instead of once per row and token tile, which
// is what bounded prefill for Q5_0 (~9 integer ops per weight vector) and the
// K-quants (whose old generic loop was 1 row x 4 tokens: 5 loads per 4 FMAs).
// AVX3 (32 registers): 6 x 4 accumulators; the 16-register targets: 3 x 4
// (12 independent FMA chains: 2 x 4 left the two FMA ports idle half the time,
// 25 vs 48 GMAC/s on AVX2; on AVX3 6 x 4 beat 4 x 4 by 10-20 %, 4 x 6 did not).
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
constexpr size_t kGR = 6, kGT = 4;
#else
constexpr size_t kGR = 3, kGT = 4;
#endif
// Quantized types with a register-tile kernel use panels from this many tokens.
constexpr size_t kPanelMinTok = 2 * kGT;

template <size_t NR, size_t NT>
HWY_ATTR HWY_INLINE void PanelTile(const float* HWY_RESTRICT P, size_t n_in,
                                   const float* HWY_RESTRICT x, size_t ldx, float* HWY_RESTRICT out,
                                   size_t ldo) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  hn::Vec<decltype(df)> acc[NR][NT];
  for (size_t r = 0; r < NR; ++r)
    for (size_t t = 0; t < NT; ++t) acc[r][t] = hn::Zero(df);
  for (size_t j = 0; j < n_in; j += N) {
    hn::Vec<decltype(df)> w[NR];
    for (size_t r = 0; r < NR; ++r) w[r] = hn::LoadU(df, P + r * n_in + j);
    for (size_t t = 0; t < NT; ++t) {
      const auto xv = hn::LoadU(df, x + t * ldx + j);
      for (size_t r = 0; r < NR; ++r) acc[r][t] = hn::MulAdd(w[r], xv, acc[r][t]);
    }
  }
  for (size_t r = 0; r < NR; ++r)
    for (size_t t = 0; t < NT; ++t) out[t * ldo + r] = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
}

// One panel of NR rows (P, row stride n_in) x all tokens.
template <size_t NR>
HWY_ATTR void PanelRows(const float* P, size_t n_in, const float* X, size_t ldx, size_t n_tok,
                        float* Y, size_t ldy) {
  size_t t = 0;
  for (; t + kGT <= n_tok; t += kGT)
    PanelTile<NR, kGT>(P, n_in, X + t * ldx, ldx, Y + t * ldy, ldy);
  for (; t < n_tok; ++t) PanelTile<NR, 1>(P, n_in, X + t * ldx, ldx, Y + t * ldy, ldy);
}

// Rows [r0, r1) of nb blocks each, row r at W + r * row_bytes.
HWY_ATTR void PanelGemm(int type, const uint8_t* W, size_t row_bytes, size_t nb, size_t block_elems,
                        size_t block_bytes, size_t r0, size_t r1, const float* X, size_t ldx,
                        size_t n_tok, float* Y, size_t ldy) {
  const size_t n_in = nb * block_elems;
  // kGR dequantized rows, grown once per thread, 64-byte aligned.
  thread_local std::vector<float> storage;
  if (storage.size() < kGR * n_in + 16) storage.resize(kGR * n_in + 16);
  float* P = storage.data();
  P += (16 - (reinterpret_cast<uintptr_t>(P) / sizeof(float)) % 16) % 16;
  for (size_t r = r0; r < r1; r += kGR) {
    const size_t nr = r1 - r < kGR ? r1 - r : kGR;
    for (size_t i = 0; i < nr; ++i)
      DequantBlocks(type, W + (r + i) * row_bytes, P + i * n_in, nb, block_elems, block_bytes);
    size_t i = 0;  // a short last group: tiles of 4, 2, 1 rows
    if (nr == kGR) {
      PanelRows<kGR>(P, n_in, X, ldx, n_tok, Y + r, ldy);
      i = kGR;
    }
    if constexpr (kGR > 4) {
      if (nr - i >= 4) {
        PanelRows<4>(P + i * n_in, n_in, X, ldx, n_tok, Y + r + i, ldy);
        i += 4;
      }
    }
    for (; nr - i >= 2; i += 2) PanelRows<2>(P + i * n_in, n_in, X, ldx, n_tok, Y + r + i, ldy);
    if (i < nr) PanelRows<1>(P + i * n_in, n_in, X, ldx, n_tok, Y + r + i, ldy);
  }
}

// Generic GGUF block types (K-quants, Q5_0, F16, ...): panels. On AVX3, Q5_0
// decode (few tokens) forms its weights in registers instead (QTile<kQ5_0>: Gemma 3
// decode, 1 thread, 34-36 vs 32-33 tok/s through panels); on the other targets
// that form is much slower than the panels with Q5Bytes and prefetch (AVX2: 9.4
// vs 30 tok/s), so they use panels for every token count. Same bits either way.
HWY_ATTR void GemmBlocksF32(int type, const uint8_t* W, size_t row_bytes, size_t block_elems,
                            size_t block_bytes, size_t r0, size_t r1, const float* X, size_t ldx,
                            size_t n_tok, float* Y, size_t ldy) {
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
  if (type == kQ5_0 && block_elems == 32 && block_bytes == 22 && n_tok < kPanelMinTok) {
    return GemmQF32T<kQ5_0>(W, row_bytes, row_bytes / block_bytes, r0, r1, X, ldx, n_tok, Y, ldy);
  }
#endif
  PanelGemm(type, W, row_bytes, row_bytes / block_bytes, block_elems, block_bytes, r0, r1, X, ldx,
            n_tok, Y, ldy);
}

HWY_ATTR void GemmQF32(int type, const uint8_t* W, size_t row_bytes, size_t nb, size_t r0,
                       size_t r1, const float* X, size_t ldx, size_t n_tok, float* Y, size_t ldy) {
  if (n_tok >= kPanelMinTok) {
    const size_t bb = Block32Bytes(type);
    return PanelGemm(type, W, row_bytes, nb, 32, bb, r0, r1, X, ldx, n_tok, Y, ldy);
  }
  switch (type) {
    case kQ4_0:
      return GemmQF32T<kQ4_0>(W, row_bytes, nb, r0, r1, X, ldx, n_tok, Y, ldy);
    case kQ4_1:
      return GemmQF32T<kQ4_1>(W, row_bytes, nb, r0, r1, X, ldx, n_tok, Y, ldy);
    default:
      return GemmQF32T<kQ8_0>(W, row_bytes, nb, r0, r1, X, ldx, n_tok, Y, ldy);
  }
}

// ---- gated FFN activation in fp64 (see kernels.h: gated_act_f64) ----
// One lane's fp64 operations, in the scalar formula's order (this file is built
// with -ffp-contract=off, so no operation is fused).
template <class D>
HWY_ATTR HWY_INLINE hn::Vec<D> GatedActVec(D dd, bool gelu, hn::Vec<D> x, hn::Vec<D> u) {
  hn::Vec<D> act;
  if (gelu) {  // 0.5 * x * (1.0 + tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)))
    const auto cube = hn::Mul(hn::Mul(hn::Mul(hn::Set(dd, 0.044715), x), x), x);
    const auto th =
        hn::Tanh(dd, hn::Mul(hn::Set(dd, 0.79788456080286535587989211986876), hn::Add(x, cube)));
    act = hn::Mul(hn::Mul(hn::Set(dd, 0.5), x), hn::Add(hn::Set(dd, 1.0), th));
  } else {  // x / (1.0 + exp(-x))
    act = hn::Div(x, hn::Add(hn::Set(dd, 1.0), hn::Exp(dd, hn::Neg(x))));
  }
  return hn::Mul(act, u);
}

HWY_ATTR void GatedActF64(int gelu, float* HWY_RESTRICT g, const float* HWY_RESTRICT u, size_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t N = hn::Lanes(dd);
  // Highway's Exp / Tanh are valid on [-700, 700]; a lane outside (-500, 500)
  // (large, inf, NaN) takes the scalar formula, which gives the reference's
  // inf / NaN. Lanes are independent, so each element's result depends only
  // on its own inputs (not on n or on its neighbours).
  const auto lim = hn::Set(dd, 500.0);
  for (size_t i = 0; i < n; i += N) {
    if (i + N <= n) {
      const auto x = hn::PromoteTo(dd, hn::LoadU(df, g + i));
      if (hn::AllTrue(dd, hn::Lt(hn::Abs(x), lim))) {
        const auto y = GatedActVec(dd, gelu != 0, x, hn::PromoteTo(dd, hn::LoadU(df, u + i)));
        hn::StoreU(hn::DemoteTo(df, y), df, g + i);
        continue;
      }
    }
    const size_t m = n - i < N ? n - i : N;  // tail or a vector with a lane out of range
    float gx[16] = {}, ux[16] = {}, y[16];
    memcpy(gx, g + i, m * sizeof(float));
    memcpy(ux, u + i, m * sizeof(float));
    const auto v = GatedActVec(dd, gelu != 0, hn::PromoteTo(dd, hn::LoadU(df, gx)),
                               hn::PromoteTo(dd, hn::LoadU(df, ux)));
    hn::StoreU(hn::DemoteTo(df, v), df, y);
    for (size_t k = 0; k < m; ++k)
      g[i + k] = std::fabs(gx[k]) < 500.0f ? y[k] : ScalarGatedAct(gelu != 0, gx[k], ux[k]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace touchstone::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace touchstone::cpu_simd {
HWY_EXPORT(DotF32);
HWY_EXPORT(MatvecF32);
HWY_EXPORT(AxpyF32);
HWY_EXPORT(ScaleF32);
HWY_EXPORT(AttendF32);
HWY_EXPORT(AttendMultiF32);
HWY_EXPORT(GemmQF32);
HWY_EXPORT(GemmBlocksF32);
HWY_EXPORT(DequantBlocks);
HWY_EXPORT(GatedActF64);

void gated_act_f64(bool gelu, float* g, const float* u, size_t n) {
  HWY_DYNAMIC_DISPATCH(GatedActF64)(gelu ? 1 : 0, g, u, n);
}

void dequantize_blocks(int ggml_type, const uint8_t* src, float* dst, size_t n_blocks,
                       size_t block_elems, size_t block_bytes) {
  HWY_DYNAMIC_DISPATCH(DequantBlocks)(ggml_type, src, dst, n_blocks, block_elems, block_bytes);
}

void gemm_blocks_f32(int ggml_type, const uint8_t* W, size_t row_bytes, size_t block_elems,
                     size_t block_bytes, size_t r0, size_t r1, const float* X, size_t ldx,
                     size_t n_tok, float* Y, size_t ldy) {
  HWY_DYNAMIC_DISPATCH(GemmBlocksF32)
  (ggml_type, W, row_bytes, block_elems, block_bytes, r0, r1, X, ldx, n_tok, Y, ldy);
}

void gemm_q_f32(QType type, const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
                const float* X, size_t ldx, size_t n_tok, float* Y, size_t ldy) {
  HWY_DYNAMIC_DISPATCH(GemmQF32)(int(type), W, row_bytes, nb, r0, r1, X, ldx, n_tok, Y, ldy);
}

float dot_f32(const float* a, const float* b, size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n);
}
void matvec_f32(const float* W, size_t ld, const float* x, float* y, size_t n_rows, size_t n) {
  HWY_DYNAMIC_DISPATCH(MatvecF32)(W, ld, x, y, n_rows, n);
}
void axpy_f32(float a, const float* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyF32)(a, x, y, n);
}
void scale_f32(float a, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(ScaleF32)(a, y, n); }
void attend_f32(const float* q, const float* K, const float* V, size_t ld, size_t hd, size_t n_kv,
                float scale, float* scores, float* out) {
  HWY_DYNAMIC_DISPATCH(AttendF32)(q, K, V, ld, hd, n_kv, scale, scores, out);
}
void attend_multi_f32(size_t G, const float* const* q, const float* K, const float* V, size_t ld,
                      size_t hd, const size_t* t0, const size_t* t1, float scale, float* scores,
                      size_t ld_scores, float* const* out) {
  HWY_DYNAMIC_DISPATCH(AttendMultiF32)(G, q, K, V, ld, hd, t0, t1, scale, scores, ld_scores, out);
}

namespace {

// What this CPU runs, read before anything is forced: in Highway 1.0.3 the mask
// of SetSupportedTargetsForTest replaces hwy::SupportedTargets() (it is not
// intersected with the CPU's). Every forcing below calls this first.
int64_t cpu_targets() {
  static const int64_t t = hwy::SupportedTargets();
  return t;
}

// The target force_hwy_target(0) restores: 0 (all), or TOUCHSTONE_CPU_SIMD_TARGET's.
std::atomic<int64_t> g_default_target{0};

std::string names(const std::vector<IsaTarget>& ts, bool runnable_only) {
  std::string out;
  for (const IsaTarget& t : ts) {
    if (runnable_only && !t.runnable) continue;
    out += (out.empty() ? "" : " ") + t.name;
  }
  return out.empty() ? "none" : out;
}

bool same_name(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }

}  // namespace

std::vector<std::pair<int64_t, std::string>> hwy_targets() {
  std::vector<std::pair<int64_t, std::string>> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.emplace_back(t, hwy::TargetName(t));
  return out;
}

void force_hwy_target(int64_t target) {
  cpu_targets();
  hwy::SetSupportedTargetsForTest(target ? target : g_default_target.load());
}

std::vector<IsaTarget> compiled_hwy_targets() {
  std::vector<IsaTarget> out;
  // HWY_TARGETS: the targets foreach_target compiled this file for; lower bit = better.
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    const int64_t bit = rest & -rest;
    out.push_back({bit, hwy::TargetName(bit), (cpu_targets() & bit) != 0});
  }
  return out;
}

QLevel qlevel_cap(int64_t hwy_target) {
#if HWY_ARCH_X86
  if (hwy_target == HWY_AVX3_DL) return QLevel::AVX512VNNI;
  if (hwy_target == HWY_AVX3 || hwy_target == HWY_AVX2) return QLevel::AVX2;
#endif
  (void)hwy_target;
  return QLevel::Scalar;
}

const IsaSelection& select_isa_from_env() {
  static const IsaSelection sel = [] {
    IsaSelection s;
    const char* env = std::getenv("TOUCHSTONE_CPU_SIMD_TARGET");
    if (!env || !*env) return s;
    const std::vector<IsaTarget> ts = compiled_hwy_targets();
    const std::string lists = " (compiled into cpu_simd: " + names(ts, false) +
                              "; this CPU runs: " + names(ts, true) + ")";
    for (const IsaTarget& t : ts) {
      if (!same_name(t.name, env)) continue;
      if (!t.runnable) {
        s.status = IsaSelection::NotRunnable;
        s.message = "TOUCHSTONE_CPU_SIMD_TARGET=" + std::string(env) +
                    ": this CPU cannot run the Highway target " + t.name + lists;
        return s;
      }
      s.forced = t.name;
      g_default_target.store(t.bit);
      force_hwy_target(t.bit);
      cap_qlevel(qlevel_cap(t.bit));
      return s;
    }
    s.status = IsaSelection::NotCompiled;
    s.message = "TOUCHSTONE_CPU_SIMD_TARGET=" + std::string(env) +
                ": not a Highway target compiled into cpu_simd" + lists;
    return s;
  }();
  return sel;
}

std::string hwy_current_target() {
  // The best target among those supported (and not masked by a test).
  const int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(supported & -supported);
}
}  // namespace touchstone::cpu_simd
#endif
