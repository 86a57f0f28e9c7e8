// kernels_hwy_blocks.cpp - GGUF weight blocks x fp32 activations (kernels.h:
// gemm_q_f32, gemm_blocks_f32, dequantize_blocks): weights dequantized in
// registers or into panels, compiled once per Highway target (foreach_target)
// and dispatched at run time (HWY_DYNAMIC_DISPATCH).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels_hwy_blocks.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels_hwy_kquant-inl.h"

#include <string.h>

#include <cmath>
#include <cstdlib>

#include "kernels.h"
#include "touchstone/model/quant.h"

#ifndef TS_CPU_H2F_EXACT
#define TS_CPU_H2F_EXACT
namespace touchstone::cpu_simd {
inline float h2f_exact(uint16_t h) { return touchstone::gguf::fp16_to_fp32(h); }
}  // namespace touchstone::cpu_simd
#endif

#ifndef TS_CPU_KERNELS_HWY_BLOCKS_ONCE
#define TS_CPU_KERNELS_HWY_BLOCKS_ONCE
namespace touchstone::cpu_simd {
// The ggml types (touchstone::gguf::TensorType) of the blocks these kernels read.
inline constexpr int kQ4_0 = int(gguf::TensorType::Q4_0), kQ4_1 = int(gguf::TensorType::Q4_1),
                     kQ5_0 = int(gguf::TensorType::Q5_0), kQ8_0 = int(gguf::TensorType::Q8_0),
                     kQ4_K = int(gguf::TensorType::Q4_K), kQ6_K = int(gguf::TensorType::Q6_K),
                     kMXFP4 = int(gguf::TensorType::MXFP4);
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

#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
// AVX3, Q5_0, one block of NR rows x NT tokens (see QTile): a 5-bit block has 32
// possible weights, float(k - 16) * d for k = 0..31, formed exactly as the
// per-element form (the same multiply of the same inputs) into two registers,
// k < 16 and k >= 16; per 16 weights one vpermps picks from the first by nibble
// and a second, masked by qh (bit i: element i's fifth bit), from the other.
// One FMA per 16 weights and token, in element order. (vpermt2ps with the fifth
// bit ORed into the index measured slower here: AMD EPYC, 8.4 vs 12.4 GMAC/s.)
template <int NR, int NT>
HWY_ATTR HWY_INLINE void Q5BlockAVX3(const uint8_t* const* blk, const VecF* d,
                                     const float* HWY_RESTRICT x, size_t ldx, VecF (&acc)[NR][NT]) {
  const hn::ScalableTag<float> df;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 k_lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(16)));
  const __m512 k_hi = _mm512_cvtepi32_ps(iota);  // k - 16 for k = 16..31
  __m512 t_lo[NR], t_hi[NR];
  __m512i z[NR];
  uint32_t qh[NR];
  for (int r = 0; r < NR; ++r) {
    t_lo[r] = _mm512_mul_ps(k_lo, d[r].raw);
    t_hi[r] = _mm512_mul_ps(k_hi, d[r].raw);
    memcpy(&qh[r], blk[r] + 2, 4);
    z[r] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 6)));
  }
  for (int half = 0; half < 2; ++half) {
    VecF w[NR];
    for (int r = 0; r < NR; ++r) {
      // vpermps reads the low 4 bits of each index lane: the low nibble as is.
      const __m512i nib = half == 0 ? z[r] : _mm512_srli_epi32(z[r], 4);
      const __mmask16 hi = __mmask16(half == 0 ? qh[r] & 0xffffu : qh[r] >> 16);
      w[r].raw = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(nib, t_lo[r]), hi, nib, t_hi[r]);
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
    if constexpr (T == kQ5_0) {
      const uint8_t* blk[NR];
      for (int r = 0; r < NR; ++r) blk[r] = qs[r] - off;
      Q5BlockAVX3<NR, NT>(blk, d, x + b * 32, ldx, acc);
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
    // Q8_0 decode reads its rows one at a time: a single sequential stream.
    // kDR interleaved row streams (34-byte steps at a 20-block row pitch) run at
    // half the rate from DRAM (AMD EPYC, 1 thread, Gemma 3's 262,144 x 640 head
    // shape: 7.8 vs 15.3 GMAC/s; same bits, the tile never changes results).
    if constexpr (T != kQ8_0) {
      for (; r + kDR <= r1; r += kDR)
        QTile<T, kDR, 1>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r, ldy);
    }
    for (; r < r1; ++r)
      QTile<T, 1, 1>(W + r * row_bytes, row_bytes, nb, X + t * ldx, ldx, Y + t * ldy + r, ldy);
  }
}

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

// MXFP4 (ggml block_mxfp4): {e, qs[16]} = 17 bytes per 32 elements, element j the
// low nibble of qs[j] (j < 16) or the high nibble of qs[j - 16], an index into
// kvalues_mxfp4 (the e2m1 values doubled); the weight float(kvalues[k]) * d with
// d = e8m0_to_fp32_half(e), as ggml's dequantize_row_mxfp4 (quant.cpp deq_mxfp4).
// With 16 lanes the 16 possible values of a block are formed first and looked up
// per nibble (as DequantQ4Table); otherwise the int8 values are looked up bytewise
// and converted N at a time. The same operations on the same inputs either way.
HWY_ATTR HWY_INLINE void DequantMxfp4(const uint8_t* src, float* y, size_t nb) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const size_t N = hn::Lanes(df);
  constexpr size_t bb = sizeof(touchstone::gguf::block_mxfp4);
  const auto kv = hn::PromoteTo(di, hn::LoadU(di8, touchstone::gguf::kvalues_mxfp4));
  for (size_t i = 0; i < nb; ++i, src += bb, y += 32) {
    if ((i * bb) % 64 < bb) __builtin_prefetch(src + kPrefetch);
    const auto d = hn::Set(df, touchstone::gguf::e8m0_to_fp32_half(src[0]));
    const uint8_t* qs = src + 1;
    if (N == 16) {
      const auto table = hn::Mul(hn::ConvertTo(df, kv), d);
      const auto raw = hn::PromoteTo(du, hn::LoadU(du8, qs));
      const auto lo = hn::BitCast(di, hn::And(raw, hn::Set(du, 0x0f)));
      const auto hi = hn::BitCast(di, hn::ShiftRight<4>(raw));
      hn::StoreU(hn::TableLookupLanes(table, hn::IndicesFromVec(df, lo)), df, y);
      hn::StoreU(hn::TableLookupLanes(table, hn::IndicesFromVec(df, hi)), df, y + 16);
      continue;
    }
    int8_t v[32];
    for (size_t j = 0; j < 16; ++j) {
      v[j] = touchstone::gguf::kvalues_mxfp4[qs[j] & 0x0f];
      v[j + 16] = touchstone::gguf::kvalues_mxfp4[qs[j] >> 4];
    }
    for (size_t l = 0; l < 32; l += N)
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, v + l))), d), df,
                 y + l);
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
// and MXFP4 as dequantize_row_mxfp4: float(kvalues_mxfp4[k]) * d (DequantMxfp4).
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
  if (type == kMXFP4) {
    DequantMxfp4(src, y, nb);
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
  // Q4_K / Q6_K decode: weights formed in registers (kernels_hwy_kquant-inl.h).
  if (type == kQ4_K && block_elems == 256 && block_bytes == 144 && n_tok < kPanelMinTok) {
    return GemmKQuantRegs<false>(W, row_bytes, r0, r1, X, ldx, n_tok, Y, ldy);
  }
  if (type == kQ6_K && block_elems == 256 && block_bytes == 210 && n_tok < kPanelMinTok) {
    return GemmKQuantRegs<true>(W, row_bytes, r0, r1, X, ldx, n_tok, Y, ldy);
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

}  // namespace HWY_NAMESPACE
}  // namespace touchstone::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace touchstone::cpu_simd {
HWY_EXPORT(GemmQF32);
HWY_EXPORT(GemmBlocksF32);
HWY_EXPORT(DequantBlocks);

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
}  // namespace touchstone::cpu_simd
#endif
