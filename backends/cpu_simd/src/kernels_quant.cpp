// kernels_quant.cpp - quantized weight blocks x int8 activation blocks.
//
// Weight blocks are read exactly as stored in the GGUF file (ggml-common.h):
//   Q4_0: {fp16 d; u8 qs[16]}        w = d * (q - 8)
//   Q4_1: {fp16 d; fp16 m; u8 qs[16]} w = d * q + m
//   Q8_0: {fp16 d; s8 qs[32]}        w = d * q
// with element i (< 16) in the low nibble of qs[i] and element i + 16 in its
// high nibble. Activations: see quantize_act() in kernels.h.
//
// Per block b of one (row, token) pair the exact integer sum
//   isum_b = sum_i q_w[i] * q_a[i]
// is computed (vpdpbusd / vpmaddubsw+vpmaddwd / int32), then in fp32
//   Q4_1: y += (d_w * d_a) * isum_b + m_w * s_a
//   Q4_0: y += (d_w * d_a) * isum_b - 8 d_w * s_a
//   Q8_0: y += (d_w * d_a) * isum_b
// accumulated per vector lane in block order and reduced at the end of the row.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "kernels.h"

namespace touchstone::cpu_simd {
namespace {

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  // Exact binary16 -> binary32 (portable; the SIMD paths use F16C).
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

constexpr size_t kBlockBytes[3] = {18, 20, 34};  // Q4_0, Q4_1, Q8_0
constexpr size_t kPrefetch = 4096;               // bytes ahead of the decode weight stream
constexpr int tix(QType t) { return t == QType::Q4_0 ? 0 : t == QType::Q4_1 ? 1 : 2; }

// ------------------------------------------------------------------ scalar
template <QType T>
float block_dot_scalar(const uint8_t* blk, const int8_t* a, float da, float sa) {
  int32_t isum = 0;
  if constexpr (T == QType::Q8_0) {
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
    for (int i = 0; i < 32; ++i) isum += int32_t{q[i]} * int32_t{a[i]};
    return h2f(blk) * da * static_cast<float>(isum);
  } else {
    const uint8_t* q = blk + (T == QType::Q4_1 ? 4 : 2);
    for (int i = 0; i < 16; ++i) {
      isum += int32_t(q[i] & 0x0f) * int32_t{a[i]} + int32_t(q[i] >> 4) * int32_t{a[i + 16]};
    }
    const float d = h2f(blk);
    const float m = T == QType::Q4_1 ? h2f(blk + 2) : -8.0f * d;
    return d * da * static_cast<float>(isum) + m * sa;
  }
}

template <QType T>
void gemm_scalar(const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
                 const ActRow* X, size_t n_tok, float* Y, size_t ldy) {
  constexpr size_t bb = kBlockBytes[tix(T)];
  for (size_t t = 0; t < n_tok; ++t) {
    for (size_t r = r0; r < r1; ++r) {
      const uint8_t* row = W + r * row_bytes;
      float acc = 0.0f;
      for (size_t b = 0; b < nb; ++b)
        acc += block_dot_scalar<T>(row + b * bb, X[t].qs + b * 32, X[t].d[b], X[t].s[b]);
      Y[t * ldy + r] = acc;
    }
  }
}

// ------------------------------------------------------------------ AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scales of one block for the NR rows of a tile: [d_w] and [m_w] (Q4_1) /
// [-8 d_w] (Q4_0) / [0] (Q8_0) as 4-lane vectors, all rows in one vcvtph2ps.
// Scales of one block for the NR (<= 4) rows of a tile: [d_w] and [m_w] (Q4_1) /
// [-8 d_w] (Q4_0) / [0] (Q8_0) as 4-lane vectors, all rows in one vcvtph2ps of
// the blocks' first 4 bytes, gathered in registers (vmovd, unpacks: narrow
// stores read back by one wide load would miss store forwarding).
template <QType T, int NR>
inline void scales_avx2(const uint8_t* const* blk, __m128* dw, __m128* mw) {
  auto ld = [blk](int r) {
    int32_t v;
    std::memcpy(&v, blk[r], 4);
    return _mm_cvtsi32_si128(v);
  };
  __m128i lo = ld(0), hi = _mm_setzero_si128();
  if constexpr (NR > 1) lo = _mm_unpacklo_epi32(lo, ld(1));
  if constexpr (NR > 2) hi = ld(2);
  if constexpr (NR > 3) hi = _mm_unpacklo_epi32(hi, ld(3));
  const __m256 s = _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi));  // [d0 x0 d1 x1 | d2 x2 d3 x3]
  const __m128 s0 = _mm256_castps256_ps128(s), s1 = _mm256_extractf128_ps(s, 1);
  *dw = _mm_shuffle_ps(s0, s1, _MM_SHUFFLE(2, 0, 2, 0));
  if constexpr (T == QType::Q4_1) *mw = _mm_shuffle_ps(s0, s1, _MM_SHUFFLE(3, 1, 3, 1));
  if constexpr (T == QType::Q4_0) *mw = _mm_mul_ps(*dw, _mm_set1_ps(-8.0f));
  if constexpr (T == QType::Q8_0) *mw = _mm_setzero_ps();
}

// AVX2 (llama.cpp's ggml_vec_dot_q4_1_q8_1 idea): per block and (row, token)
// vpmaddubsw + vpmaddwd give 8 int32 partial sums, one vcvtdq2ps and one FMA
// with d_w d_a scale them into the 8-lane accumulator. The scales are vector
// work per block and token for all NR rows at once: d_w d_a (4 lanes, stored
// and read back as vbroadcastss loads, no shuffle-port broadcast) and the min
// terms m_w s_a accumulated lane r = row r. Decode (NT == 1) prefetches the
// weight rows 4 KiB ahead. Per output: blocks in order, the same operations
// whatever NR and NT are.
template <QType T, int NR, int NT>
void tile_avx2(const uint8_t* const* rows, size_t nb, const ActRow* X, float* out /*[NT][NR]*/) {
  constexpr size_t bb = kBlockBytes[tix(T)];
  __m256 acc[NR][NT];
  __m128 macc[NT];
  for (int t = 0; t < NT; ++t) {
    macc[t] = _mm_setzero_ps();
    for (int r = 0; r < NR; ++r) acc[r][t] = _mm256_setzero_ps();
  }
  const __m256i lo_mask = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t b = 0; b < nb; ++b) {
    __m256i w[NR], wabs[NR];
    const uint8_t* blk[NR];
    for (int r = 0; r < NR; ++r) {
      blk[r] = rows[r] + b * bb;
      if constexpr (NT == 1) {
        if ((b * bb) % 64 < bb) __builtin_prefetch(blk[r] + kPrefetch);
      }
      if constexpr (T == QType::Q8_0) {
        w[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 2));
        wabs[r] = _mm256_sign_epi8(w[r], w[r]);
      } else {
        const __m128i q =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + (T == QType::Q4_1 ? 4 : 2)));
        const __m256i qq =
            _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
        w[r] = _mm256_and_si256(qq, lo_mask);
      }
    }
    __m128 dw, mw;
    scales_avx2<T, NR>(blk, &dw, &mw);
    for (int t = 0; t < NT; ++t) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(X[t].qs + b * 32));
      alignas(16) float sc[4];
      _mm_store_ps(sc, _mm_mul_ps(dw, _mm_set1_ps(X[t].d[b])));
      asm volatile("" : : "m"(sc) : "memory");  // reload as vbroadcastss from memory
      if constexpr (T != QType::Q8_0)
        macc[t] = _mm_add_ps(macc[t], _mm_mul_ps(mw, _mm_set1_ps(X[t].s[b])));
      for (int r = 0; r < NR; ++r) {
        __m256i p;
        if constexpr (T == QType::Q8_0) {
          p = _mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(a, w[r]));
        } else {
          p = _mm256_maddubs_epi16(w[r], a);
        }
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        acc[r][t] = _mm256_fmadd_ps(f, _mm256_broadcast_ss(sc + r), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    alignas(16) float m4[4];
    _mm_store_ps(m4, macc[t]);
    for (int r = 0; r < NR; ++r) out[t * NR + r] = hsum256(acc[r][t]) + m4[r];
  }
}

// The same numbers as quantize_act_scalar (max, 1/d, x * (1/d) rounded half to
// even by vcvtps2dq, the int32 sum), 32 values per block in 4 vectors.
void quantize_act_avx2(const float* x, size_t n, ActRow out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t b = 0; b < n / 32; ++b) {
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + b * 32 + size_t(8 * k));
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
    // packs interleave 128-bit lanes: bytes come out as dwords 0 4 1 5 2 6 3 7.
    const __m256i p16 =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i p8 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + b * 32), p8);
    const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    out.d[b] = d;
    out.s[b] = d * static_cast<float>(_mm_cvtsi128_si32(s));
  }
}
#pragma GCC pop_options

// ------------------------------------------------------------------ AVX-512 VNNI
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

// Two blocks per 512-bit register, laid out [lo0 hi0 lo1 hi1] (16 bytes each,
// matching the activation bytes [a0 | a1]) and built without shuffles: two
// 128-bit broadcast loads (the second one masked) and a masked nibble shift.
// Scales per block pair: v = [d_w0 x, m_w0 x, d_w1 x, m_w1 x] (fp16 -> fp32) times
// [d_a0, s_a0, d_a1, s_a1]; the d terms scale the 8 int32 lanes of their
// block (one vpermps), the m terms accumulate in a 4-lane register.
// One row's block pair (b0, b1 = b0 + one block): its weights w as
// [lo0 hi0 lo1 hi1] (Q8_0: the 64 signed bytes) and its scales v.
template <QType T>
__attribute__((always_inline)) inline void vnni_pair(const uint8_t* b0, const uint8_t* b1,
                                                     __m512i& w, __m128& v) {
  if constexpr (T == QType::Q8_0) {
    w = _mm512_mask_broadcast_i64x4(
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))), 0xf0,
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2)));
  } else {
    constexpr int off = T == QType::Q4_1 ? 4 : 2;
    __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + off)));
    z = _mm512_mask_broadcast_i32x4(z, 0xff00,
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + off)));
    // 128-bit chunks 1 and 3 take the high nibbles (words 8-15, 24-31).
    z = _mm512_mask_srli_epi16(z, 0xff00ff00u, z, 4);
    w = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
  }
  uint32_t h0, h1;
  if constexpr (T == QType::Q4_1) {
    std::memcpy(&h0, b0, 4);  // d, m
    std::memcpy(&h1, b1, 4);
    v = _mm_cvtph_ps(_mm_set_epi32(0, 0, int(h1), int(h0)));
  } else {
    uint16_t d0, d1;
    std::memcpy(&d0, b0, 2);
    std::memcpy(&d1, b1, 2);
    if constexpr (T == QType::Q4_0) {
      // Q4_0: v = [d0, -8 d0, d1, -8 d1] from the halves [d0 d0 d1 d1].
      h0 = uint32_t(d0) * 0x10001u;
      h1 = uint32_t(d1) * 0x10001u;
      v = _mm_mul_ps(_mm_cvtph_ps(_mm_set_epi32(0, 0, int(h1), int(h0))),
                     _mm_setr_ps(1.0f, -8.0f, 1.0f, -8.0f));
    } else {
      v = _mm_cvtph_ps(_mm_set_epi32(0, 0, int(d1), int(d0)));  // [d0 0 d1 0]
    }
  }
}

// Per output: blocks in order, the same operations whatever NR and NT are.
template <QType T, int NR, int NT>
void tile_vnni(const uint8_t* const* rows, size_t nb, const ActRow* X, float* out /*[NT][NR]*/) {
  constexpr size_t bb = kBlockBytes[tix(T)];
  __m512 acc[NR][NT];
  __m128 macc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      acc[r][t] = _mm512_setzero_ps();
      macc[r][t] = _mm_setzero_ps();
    }
  const __m512i idx02 = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i zero = _mm512_setzero_si512();
  const size_t npair = nb / 2;
  for (size_t p = 0; p < npair; ++p) {
    __m512i w[NR];
    __m128 v[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* b0 = rows[r] + 2 * p * bb;
      const uint8_t* b1 = b0 + bb;
      if constexpr (NT == 1) {
        // Decode streams the weights from DRAM once: prefetch ahead, every
        // cache line of each row stream (a pair is 36-68 bytes).
        __builtin_prefetch(b0 + kPrefetch);
        if constexpr (2 * bb > 64) __builtin_prefetch(b0 + kPrefetch + 64);
      }
      vnni_pair<T>(b0, b1, w[r], v[r]);
    }
    for (int t = 0; t < NT; ++t) {
      const __m512i a = _mm512_loadu_si512(X[t].qs + p * 64);
      // [d_a0 s_a0 d_a1 s_a1]. Two floats each, only 4-byte aligned: _mm_loadl_epi64
      // is an unaligned 64-bit load (_mm_load_sd through a double* was UB that UBSan
      // reports on the VNNI path; same bits).
      const __m128 ads = _mm_unpacklo_ps(
          _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(X[t].d + 2 * p))),
          _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(X[t].s + 2 * p))));
      __m512i a_signed = a;
      for (int r = 0; r < NR; ++r) {
        __m512i isum;
        if constexpr (T == QType::Q8_0) {
          const __mmask64 neg = _mm512_movepi8_mask(w[r]);
          a_signed = _mm512_mask_sub_epi8(a, neg, zero, a);
          isum = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w[r]), a_signed);
        } else {
          isum = _mm512_dpbusd_epi32(zero, w[r], a);
        }
        const __m128 sc = _mm_mul_ps(v[r], ads);
        if constexpr (T != QType::Q8_0) macc[r][t] = _mm_add_ps(macc[r][t], sc);
        acc[r][t] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                            _mm512_permutexvar_ps(idx02, _mm512_castps128_ps512(sc)), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) {
      float y = _mm512_reduce_add_ps(acc[r][t]);
      if constexpr (T != QType::Q8_0) {
        alignas(16) float m4[4];
        _mm_store_ps(m4, macc[r][t]);
        y += m4[1] + m4[3];
      }
      if (nb & 1) {
        const size_t b = nb - 1;
        y += block_dot_scalar<T>(rows[r] + b * bb, X[t].qs + b * 32, X[t].d[b], X[t].s[b]);
      }
      out[t * NR + r] = y;
    }
  }
}
#pragma GCC pop_options

using TileFn = void (*)(const uint8_t* const*, size_t, const ActRow*, float*);

template <QType T, int NR, int NT>
TileFn pick_tile(QLevel lv) {
  return lv == QLevel::AVX512VNNI ? &tile_vnni<T, NR, NT> : &tile_avx2<T, NR, NT>;
}

template <QType T>
void gemm_simd(QLevel lv, const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
               const ActRow* X, size_t n_tok, float* Y, size_t ldy) {
  constexpr int R = 4, C = 4;
  const TileFn f44 = pick_tile<T, R, C>(lv), f41 = pick_tile<T, R, 1>(lv);
  const TileFn f14 = pick_tile<T, 1, C>(lv), f11 = pick_tile<T, 1, 1>(lv);
  constexpr size_t kTokChunk = 32;  // activations of a chunk stay in L1/L2 while weights stream
  float out[R * C];
  const uint8_t* rows[R];
  for (size_t t0 = 0; t0 < n_tok; t0 += kTokChunk) {
    const size_t t1 = std::min(n_tok, t0 + kTokChunk);
    size_t r = r0;
    for (; r < r1; r += R) {
      const int nr = int(std::min<size_t>(R, r1 - r));
      for (int i = 0; i < nr; ++i) rows[i] = W + (r + size_t(i)) * row_bytes;
      size_t t = t0;
      // Q8_0 decode: one row at a time, a single sequential stream from DRAM
      // (R interleaved rows ran at about half the rate; kernels_hwy_blocks.cpp).
      const bool single = T == QType::Q8_0 && t1 - t0 < size_t(C);
      if (nr == R && !single) {
        for (; t + C <= t1; t += C) {
          f44(rows, nb, X + t, out);
          for (int j = 0; j < C; ++j)
            for (int i = 0; i < R; ++i) Y[(t + size_t(j)) * ldy + r + size_t(i)] = out[j * R + i];
        }
        for (; t < t1; ++t) {
          f41(rows, nb, X + t, out);
          for (int i = 0; i < R; ++i) Y[t * ldy + r + size_t(i)] = out[i];
        }
      } else {
        for (int i = 0; i < nr; ++i) {
          const uint8_t* one[1] = {rows[i]};
          size_t tt = t;
          for (; tt + C <= t1; tt += C) {
            f14(one, nb, X + tt, out);
            for (int j = 0; j < C; ++j) Y[(tt + size_t(j)) * ldy + r + size_t(i)] = out[j];
          }
          for (; tt < t1; ++tt) {
            f11(one, nb, X + tt, out);
            Y[tt * ldy + r + size_t(i)] = out[0];
          }
        }
      }
    }
  }
}

QLevel detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni")) {
    return QLevel::AVX512VNNI;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return QLevel::AVX2;
  return QLevel::Scalar;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{int(detect())};
  return level;
}

// cap_qlevel (TOUCHSTONE_CPU_SIMD_TARGET): the most qlevel_best() reports.
std::atomic<int>& level_cap() {
  static std::atomic<int> cap{int(QLevel::AVX512VNNI)};
  return cap;
}

}  // namespace

size_t qtype_block_bytes(QType t) { return kBlockBytes[tix(t)]; }

namespace {
// Round half to even (the default MXCSR mode, as vcvtps2dq): every level gives
// the same int8 activations.
void quantize_act_scalar(const float* x, size_t n, ActRow out) {
  const size_t nb = n / 32;
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int8_t q = static_cast<int8_t>(std::nearbyint(xb[i] * id));
      out.qs[b * 32 + size_t(i)] = q;
      sum += q;
    }
    out.d[b] = d;
    out.s[b] = d * static_cast<float>(sum);
  }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
void quantize_act_avx512(const float* x, size_t n, ActRow out) {
  const size_t nb = n / 32;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (size_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + b * 32), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + b * 32 + 16), _mm512_cvtsepi32_epi8(q1));
    out.d[b] = d;
    out.s[b] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
}
#pragma GCC pop_options
}  // namespace

void quantize_act(const float* x, size_t n, ActRow out) {
  if (qlevel() == QLevel::AVX512VNNI) return quantize_act_avx512(x, n, out);
  if (qlevel() == QLevel::AVX2) return quantize_act_avx2(x, n, out);
  quantize_act_scalar(x, n, out);
}

void gemm_q(QType type, const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
            const ActRow* X, size_t n_tok, float* Y, size_t ldy) {
  const QLevel lv = qlevel();
  if (lv == QLevel::Scalar) {
    switch (type) {
      case QType::Q4_0:
        return gemm_scalar<QType::Q4_0>(W, row_bytes, nb, r0, r1, X, n_tok, Y, ldy);
      case QType::Q4_1:
        return gemm_scalar<QType::Q4_1>(W, row_bytes, nb, r0, r1, X, n_tok, Y, ldy);
      case QType::Q8_0:
        return gemm_scalar<QType::Q8_0>(W, row_bytes, nb, r0, r1, X, n_tok, Y, ldy);
    }
  }
  switch (type) {
    case QType::Q4_0:
      return gemm_simd<QType::Q4_0>(lv, W, row_bytes, nb, r0, r1, X, n_tok, Y, ldy);
    case QType::Q4_1:
      return gemm_simd<QType::Q4_1>(lv, W, row_bytes, nb, r0, r1, X, n_tok, Y, ldy);
    case QType::Q8_0:
      return gemm_simd<QType::Q8_0>(lv, W, row_bytes, nb, r0, r1, X, n_tok, Y, ldy);
  }
}

QLevel qlevel_best() {
  static const QLevel detected = detect();
  return std::min(detected, QLevel(level_cap().load(std::memory_order_relaxed)));
}
void cap_qlevel(QLevel cap) {
  level_cap().store(int(cap), std::memory_order_relaxed);
  force_qlevel(qlevel_best());
}
QLevel qlevel() { return QLevel(level_storage().load(std::memory_order_relaxed)); }
void force_qlevel(QLevel level) {
  level_storage().store(int(std::min(level, qlevel_best())), std::memory_order_relaxed);
}
const char* qlevel_name(QLevel level) {
  switch (level) {
    case QLevel::Scalar:
      return "scalar";
    case QLevel::AVX2:
      return "avx2";
    case QLevel::AVX512VNNI:
      return "avx512vnni";
  }
  return "?";
}

}  // namespace touchstone::cpu_simd
