// kernels_hwy_kquant-inl.h - Q4_K and Q6_K rows x a few fp32 tokens with the
// weights formed in registers (AVX3 only): decode's path for the K-quants, which
// through the panels (kernels_hwy_blocks.cpp) paid a store and a reload of every
// dequantized weight. Included once per Highway target by kernels_hwy_blocks.cpp
// (after hwy/highway.h; Highway's toggle pattern for the per-target guard).
//
// Same bits as the panels, by construction:
//  * every weight is formed by the same fp32 operations on the same inputs as
//    DequantQ4K / DequantQ6K (ggml's dequantize_row_q4_K / _q6_K; no FMA, the
//    including file is built with -ffp-contract=off):
//      Q4_K: (d * sc) * float(q) - (dmin * m)     Q6_K: (d * sc) * float(q - 32)
//    Q4_K's sub-block of 32 weights has 16 possible values, so its table
//    t[k] = (d * sc) * float(k) - (dmin * m), k = 0..15, is formed once and one
//    vpermps per 16 weights picks them by nibble (as Q4BlockAVX3 does for Q4_0 /
//    Q4_1); Q6_K's 6-bit q - 32 are formed with byte operations, 128 at a time;
//  * per output the operation sequence is the panels': accumulator zero, the
//    16-lane chunks in element order, one MulAdd each, then SumOfLanes.
// kquant_test's GenericBlocks checks one token against the panels' many, bit for bit.
#if defined(TS_CPU_SIMD_KERNELS_HWY_KQUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TS_CPU_SIMD_KERNELS_HWY_KQUANT_INL_H_
#undef TS_CPU_SIMD_KERNELS_HWY_KQUANT_INL_H_
#else
#define TS_CPU_SIMD_KERNELS_HWY_KQUANT_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace touchstone::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
namespace kq {
constexpr size_t kQ4KBytes = 144, kQ6KBytes = 210;  // per 256-element super-block
constexpr size_t kAhead = 4096;                     // decode's prefetch distance (bytes)

// Q4_K {fp16 d, fp16 dmin, scales[12], qs[128]}: the eight 6-bit (sc, m) pairs
// unpacked as ggml's ggml_vec_dot_q4_K_q8_K does (kmask1..3), then
// ds[k] = d * float(sc_k), ds[8 + k] = dmin * float(m_k), one fp32 multiply each
// (the products DequantQ4K forms per sub-block).
HWY_INLINE void Q4KScales(const uint8_t* blk, float* HWY_RESTRICT ds) {
  uint32_t u[4];
  memcpy(u, blk + 4, 12);
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t m03 = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = m03;
  u[0] &= kmask1;  // bytes: sc_0..7, m_0..7
  uint16_t h[2];
  memcpy(h, blk, 4);
  const __m512 dd =
      _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(h[0])), _mm256_set1_ps(_cvtsh_ss(h[1])), 1);
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
  _mm512_store_ps(ds, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(v)));
}

// Q6_K {ql[128], qh[64], int8 scales[16], fp16 d}: ds[i] = d * float(sc_i).
HWY_INLINE void Q6KScales(const uint8_t* blk, float* HWY_RESTRICT ds) {
  uint16_t h;
  memcpy(&h, blk + 208, 2);
  const __m512i v =
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
  _mm512_store_ps(ds, _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(v)));
}

// Q6_K, elements 128n .. 128n+127 of a super-block as signed bytes q - 32, in
// element order (ggml dequantize_row_q6_K: for l < 32, element 32g + l has
// q = (ql[l + 32 (g & 1)] >> 4 (g >= 2)) & 15 | ((qh[l] >> 2g) & 3) << 4).
HWY_INLINE void Q6KBytes(const uint8_t* blk, int n, int8_t* HWY_RESTRICT q) {
  const __m512i ql = _mm512_loadu_si512(blk + 64 * n);
  const __m512i qh = _mm512_broadcast_i64x4(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * n)));
  const __m512i m30 = _mm512_set1_epi8(0x30), m0f = _mm512_set1_epi8(0x0f);
  const __m512i k32 = _mm512_set1_epi8(32);
  // 16-bit lanes: bits 0-1 of each byte of qh to bits 4-5 (g = 0: << 4, g = 1: << 2)
  // and bits 4-5 / 6-7 there (g = 2: as is, g = 3: >> 2); the mask keeps them.
  const __m512i hi01 =
      _mm512_sllv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1));
  const __m512i hi23 =
      _mm512_srlv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1));
  // ternary logic 0xF8: A | (B & C)
  const __m512i q01 = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m0f), hi01, m30, 0xF8);
  const __m512i q23 =
      _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m0f), hi23, m30, 0xF8);
  _mm512_storeu_si512(q, _mm512_sub_epi8(q01, k32));
  _mm512_storeu_si512(q + 64, _mm512_sub_epi8(q23, k32));
}

// One Q4_K super-block of NR rows x NT tokens; x: the block's 256 inputs of token 0.
template <int NR, int NT>
HWY_ATTR HWY_INLINE void Q4KBlock(const uint8_t* const* blk, const float* HWY_RESTRICT x,
                                  size_t ldx, hn::Vec<hn::ScalableTag<float>> (&acc)[NR][NT]) {
  const hn::ScalableTag<float> df;
  const __m512 kf =
      _mm512_cvtepi32_ps(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  alignas(64) float ds[NR][16];
  for (int r = 0; r < NR; ++r) Q4KScales(blk[r], ds[r]);
  for (int j = 0; j < 4; ++j) {  // 64 elements: sub-blocks 2j (low nibbles), 2j + 1 (high)
    __m512i z[NR][2];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 2; ++c)
        z[r][c] = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 16 + 32 * j + 16 * c)));
    for (int h = 0; h < 2; ++h) {
      __m512 table[NR];
      for (int r = 0; r < NR; ++r)
        table[r] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(ds[r][2 * j + h]), kf),
                                 _mm512_set1_ps(ds[r][8 + 2 * j + h]));
      for (int c = 0; c < 2; ++c) {
        hn::Vec<decltype(df)> w[NR];
        for (int r = 0; r < NR; ++r)  // vpermps reads the low 4 bits of each index
          w[r].raw =
              _mm512_permutexvar_ps(h == 0 ? z[r][c] : _mm512_srli_epi32(z[r][c], 4), table[r]);
        const size_t e = size_t(64 * j + 32 * h + 16 * c);
        for (int t = 0; t < NT; ++t) {
          const auto xv = hn::LoadU(df, x + size_t(t) * ldx + e);
          for (int r = 0; r < NR; ++r) acc[r][t] = hn::MulAdd(w[r], xv, acc[r][t]);
        }
      }
    }
  }
}

// One Q6_K super-block of NR rows x NT tokens.
template <int NR, int NT>
HWY_ATTR HWY_INLINE void Q6KBlock(const uint8_t* const* blk, const float* HWY_RESTRICT x,
                                  size_t ldx, hn::Vec<hn::ScalableTag<float>> (&acc)[NR][NT]) {
  const hn::ScalableTag<float> df;
  alignas(64) float ds[NR][16];
  alignas(64) int8_t q[NR][128];
  for (int r = 0; r < NR; ++r) Q6KScales(blk[r], ds[r]);
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < NR; ++r) Q6KBytes(blk[r], n, q[r]);
    for (int c = 0; c < 8; ++c) {  // elements 128n + 16c .. +15, scale 8n + c
      hn::Vec<decltype(df)> w[NR];
      for (int r = 0; r < NR; ++r) {
        const __m512 qf = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(q[r] + 16 * c))));
        w[r].raw = _mm512_mul_ps(_mm512_set1_ps(ds[r][8 * n + c]), qf);
      }
      const size_t e = size_t(128 * n + 16 * c);
      for (int t = 0; t < NT; ++t) {
        const auto xv = hn::LoadU(df, x + size_t(t) * ldx + e);
        for (int r = 0; r < NR; ++r) acc[r][t] = hn::MulAdd(w[r], xv, acc[r][t]);
      }
    }
  }
}

// NR rows (row r at row + r * row_bytes) of nb super-blocks x NT tokens.
template <bool kQ6, int NR, int NT>
HWY_ATTR HWY_INLINE void KTile(const uint8_t* HWY_RESTRICT row, size_t row_bytes, size_t nb,
                               const float* HWY_RESTRICT x, size_t ldx, float* HWY_RESTRICT out,
                               size_t ldo) {
  const hn::ScalableTag<float> df;
  constexpr size_t bb = kQ6 ? kQ6KBytes : kQ4KBytes;
  hn::Vec<decltype(df)> acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = hn::Zero(df);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk[NR];
    for (int r = 0; r < NR; ++r) {
      blk[r] = row + size_t(r) * row_bytes + b * bb;
      // Decode streams the rows from memory once: prefetch each line ahead.
      if constexpr (NT == 1)
        for (size_t l = 0; l < bb; l += 64) __builtin_prefetch(blk[r] + kAhead + l);
    }
    if constexpr (kQ6) {
      Q6KBlock<NR, NT>(blk, x + b * 256, ldx, acc);
    } else {
      Q4KBlock<NR, NT>(blk, x + b * 256, ldx, acc);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t)
      out[size_t(t) * ldo + size_t(r)] = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
}
}  // namespace kq

// Rows [r0, r1) of Q4_K (kQ6 = false) or Q6_K super-blocks x tokens [0, n_tok):
// tiles of 4 rows x 4 tokens, then 4 rows x 1 token, row tails one at a time.
// The tile shape never changes results.
template <bool kQ6>
HWY_ATTR void GemmKQuantRegs(const uint8_t* W, size_t row_bytes, size_t r0, size_t r1,
                             const float* X, size_t ldx, size_t n_tok, float* Y, size_t ldy) {
  constexpr int kR = 4, kT = 4;
  const size_t nb = row_bytes / (kQ6 ? kq::kQ6KBytes : kq::kQ4KBytes);
  size_t t = 0;
  for (; t + kT <= n_tok; t += kT) {
    size_t r = r0;
    for (; r + kR <= r1; r += kR)
      kq::KTile<kQ6, kR, kT>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r,
                             ldy);
    for (; r < r1; ++r)
      kq::KTile<kQ6, 1, kT>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r,
                            ldy);
  }
  for (; t < n_tok; ++t) {
    size_t r = r0;
    for (; r + kR <= r1; r += kR)
      kq::KTile<kQ6, kR, 1>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r,
                            ldy);
    for (; r < r1; ++r)
      kq::KTile<kQ6, 1, 1>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r,
                           ldy);
  }
}
#endif  // AVX3

}  // namespace HWY_NAMESPACE
}  // namespace touchstone::cpu_simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
