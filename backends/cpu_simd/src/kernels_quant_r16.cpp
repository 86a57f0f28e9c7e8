// kernels_quant_r16.cpp - int8 activations x Q4_0 / Q4_1 / Q5_0 / Q8_0 weights
// in a row-interleaved layout ("r16"), for the AVX-512 VNNI level.
//
// Layout (repack_r16, made once per model): rows are taken in groups of 16;
// group g, block b is one record of 16 * block_bytes bytes:
//   quants: NV 64-byte vectors (NV = 4 for Q4_x / Q5_0, 8 for Q8_0); byte 4r + i of
//           vector j = quant byte 4j + i of row r's block b, so one vpdpbusd
//           with 4 broadcast activation bytes sums 4 products for each of the
//           16 rows (lane r = row r);
//     Q4_x, Q5_0: byte 4j + i holds element 4j + i (low nibble) and 16 + 4j + i
//           (high nibble): vector j's low nibbles pair with activation quad j,
//           its high nibbles with quad 4 + j;
//     Q8_0: the signed quant plus 128 (stored as u8 = q ^ 0x80);
//   Q5_0 high bits: one 64-byte vector, lane r = row r's 32 fifth bits
//           rearranged so that bit k of byte i is element 4k + i's (quad k's
//           bits are then one shift and one mask away for all 16 rows);
//   scales: d of the 16 rows (fp16, 32 bytes), then m of the 16 rows (Q4_1).
// Row groups and blocks are in order, so rows [16 g0, 16 g1) are one
// sequential byte range: decode streams each matrix front to back.
//
// Arithmetic per (row, token), blocks b in order, two fp32 accumulators:
//   isum_b = sum_i u_i * a_i          (exact int32; u = nibble, or q + 128)
//   acc    = fma(float(isum_b), fl(d_w * d_a), acc)
//   macc   = fma(c_w, s_a, macc)      c_w = m_w (Q4_1), -8 d_w (Q4_0), -16 d_w (Q5_0),
//                                       -128 d_w (Q8_0)
//   y      = acc + macc
// (d_a, s_a: quantize_act; c * d_w is exact: c a power of two). u is the
// stored unsigned quant (Q5_0: nibble | fifth bit << 4, the value ggml's
// dequantize_row_q5_0 subtracts 16 from). The value of one
// output depends on nothing else in the call: not the token count, not the
// row range, not the thread count (batch invariance).
#include <immintrin.h>

#include <cstring>

#include "kernels.h"
#include "kernels_quant_r16k.h"

namespace touchstone::cpu_simd {
namespace {

constexpr size_t kGroup = 16;
constexpr size_t kAhead = 4096;  // decode's software prefetch distance, bytes

// GGUF type numbers (ggml_type) of the formats this kernel takes.
constexpr int kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14;

struct R16Shape {
  size_t nv;     // 64-byte quant vectors per record
  size_t qoff;   // offset of the quant nibbles / bytes in a GGUF block
  size_t block;  // GGUF block bytes
  bool has_m;    // Q4_1: a stored m per row
  bool has_qh;   // Q5_0: the fifth bits (block bytes 2-5, little-endian u32)
  float c;       // Q4_0 / Q5_0 / Q8_0: the constant c in c_w = c * d_w
  size_t record() const { return kGroup * block; }
  size_t scales() const { return nv * 64 + (has_qh ? 64 : 0); }  // offset of the d's
};

constexpr R16Shape shape(int t) {
  switch (t) {
    case kQ4_1:
      return {4, 4, 20, true, false, 0.0f};
    case kQ5_0:
      return {4, 6, 22, false, true, -16.0f};
    case kQ8_0:
      return {8, 2, 34, false, false, -128.0f};
    default:
      return {4, 2, 18, false, false, -8.0f};  // Q4_0
  }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

#include "kernels_quant_r16_inl.h"
using r16::block_isum;

// One row group: 16 rows x NT tokens, every block. Y row t at Y + t * ldy.
template <int T, int NT>
void group_tile(const uint8_t* G, size_t nb, const ActRow* X, float* Y, size_t ldy) {
  constexpr R16Shape S = shape(T);
  __m512 acc[NT], macc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
  const __m512i lo = _mm512_set1_epi8(0x0f);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* g = G + b * S.record();
    // The records stream from DRAM once per step in decode (one token or a
    // batch of them): prefetch every line of the record kAhead bytes ahead,
    // the hardware prefetchers alone lag (decode_batch/8: ~2.3x -> ~3x B = 1).
    for (size_t o = 0; o < S.record(); o += 64) __builtin_prefetch(g + kAhead + o);
    __m512i w[8];  // w[k] pairs with activation quad k (elements 4k .. 4k + 3)
#pragma GCC unroll 8
    for (size_t j = 0; j < S.nv; ++j) w[j] = _mm512_loadu_si512(g + 64 * j);
    if constexpr (T != kQ8_0) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(w[j], 4), lo);
        w[j] = _mm512_and_si512(w[j], lo);
      }
    }
    if constexpr (S.has_qh) {
      // Quad k's fifth bits are bit k of each byte: moved to bit 4 and OR-ed
      // in (vpternlogd: w | (h & 0x10)).
      const __m512i h = _mm512_loadu_si512(g + S.nv * 64);
      const __m512i b4 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i hk =
            k < 4 ? _mm512_slli_epi16(h, unsigned(4 - k)) : _mm512_srli_epi16(h, unsigned(k - 4));
        w[k] = _mm512_ternarylogic_epi32(w[k], hk, b4, 0xF8);  // a | (b & c)
      }
    }
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + S.scales())));
    __m512 cw;
    if constexpr (S.has_m) {
      cw = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + S.scales() + 32)));
    } else {
      cw = _mm512_mul_ps(dw, _mm512_set1_ps(S.c));
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512i isum = block_isum(w, X[t].qs + b * 32);
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(X[t].d[b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
      macc[t] = _mm512_fmadd_ps(cw, _mm512_set1_ps(X[t].s[b]), macc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
    _mm512_storeu_ps(Y + size_t(t) * ldy, _mm512_add_ps(acc[t], macc[t]));
}

template <int T>
void gemm_r16(const uint8_t* R, size_t nb, size_t r0, size_t r1, const ActRow* X, size_t n_tok,
              float* Y, size_t ldy) {
  const size_t rec = shape(T).record();
  for (size_t g = r0 / kGroup; g < r1 / kGroup; ++g) {
    const uint8_t* G = R + g * nb * rec;
    float* y = Y + g * kGroup;
    size_t t = 0;
    for (; t + 8 <= n_tok; t += 8) group_tile<T, 8>(G, nb, X + t, y + t * ldy, ldy);
    if (t + 4 <= n_tok) {
      group_tile<T, 4>(G, nb, X + t, y + t * ldy, ldy);
      t += 4;
    }
    if (t + 2 <= n_tok) {
      group_tile<T, 2>(G, nb, X + t, y + t * ldy, ldy);
      t += 2;
    }
    if (t < n_tok) group_tile<T, 1>(G, nb, X + t, y + t * ldy, ldy);
  }
}
#pragma GCC pop_options

}  // namespace

bool r16_type(int ggml_type) {
  return ggml_type == kQ4_0 || ggml_type == kQ4_1 || ggml_type == kQ5_0 || ggml_type == kQ8_0 ||
         r16k_type(ggml_type);
}

size_t r16_bytes(int t, size_t n_rows, size_t nb) {
  if (r16k_type(t)) return r16k_bytes(t, n_rows, nb);
  return n_rows * nb * shape(t).block;
}

// Record layout: see the top of this file.
void repack_r16(int t, const uint8_t* W, size_t row_bytes, size_t nb, size_t n_rows, uint8_t* dst) {
  if (r16k_type(t)) return repack_r16k(t, W, row_bytes, nb, n_rows, dst);
  const R16Shape S = shape(t);
  for (size_t g = 0; g < n_rows / kGroup; ++g) {
    for (size_t b = 0; b < nb; ++b) {
      uint8_t* rec = dst + (g * nb + b) * S.record();
      for (size_t r = 0; r < kGroup; ++r) {
        const uint8_t* blk = W + (g * kGroup + r) * row_bytes + b * S.block;
        for (size_t j = 0; j < S.nv; ++j)
          for (size_t i = 0; i < 4; ++i) {
            const uint8_t q = blk[S.qoff + 4 * j + i];
            rec[64 * j + 4 * r + i] = t == kQ8_0 ? uint8_t(q ^ 0x80u) : q;
          }
        if (S.has_qh) {  // bit k of byte i = fifth bit of element 4k + i
          uint32_t qh;
          std::memcpy(&qh, blk + 2, 4);
          for (size_t i = 0; i < 4; ++i) {
            uint8_t v = 0;
            for (size_t k = 0; k < 8; ++k) v |= uint8_t(((qh >> (4 * k + i)) & 1u) << k);
            rec[S.nv * 64 + 4 * r + i] = v;
          }
        }
        std::memcpy(rec + S.scales() + 2 * r, blk, 2);                        // d
        if (S.has_m) std::memcpy(rec + S.scales() + 32 + 2 * r, blk + 2, 2);  // m
      }
    }
  }
}

void gemm_q_r16(int type, const uint8_t* R, size_t nb, size_t r0, size_t r1, const ActRow* X,
                size_t n_tok, float* Y, size_t ldy) {
  switch (type) {
    case kQ4_K:
    case kQ6_K:
      return gemm_q_r16k(type, R, nb, r0, r1, X, n_tok, Y, ldy);
    case kQ4_1:
      return gemm_r16<kQ4_1>(R, nb, r0, r1, X, n_tok, Y, ldy);
    case kQ5_0:
      return gemm_r16<kQ5_0>(R, nb, r0, r1, X, n_tok, Y, ldy);
    case kQ8_0:
      return gemm_r16<kQ8_0>(R, nb, r0, r1, X, n_tok, Y, ldy);
    default:
      return gemm_r16<kQ4_0>(R, nb, r0, r1, X, n_tok, Y, ldy);
  }
}

}  // namespace touchstone::cpu_simd
