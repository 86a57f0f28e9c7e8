// kernels_quant_r16k.cpp - int8 activations x Q4_K / Q6_K weights in the
// row-interleaved layout of kernels_quant_r16.cpp, for the AVX-512 VNNI level.
//
// Layout (repack_r16k): rows in groups of 16; group g, super-block k (256
// elements, blocks j = 0..7 of 32) is one record, records in (g, k) order:
//   Q4_K, 2368 bytes: per block j, 4 vectors of 64 bytes laid out as a Q4_0
//     block of kernels_quant_r16.cpp (byte 4r + i of vector v: element 4v + i of
//     row r's block j in the low nibble, element 16 + 4v + i in the high one);
//     then d (fp16 x 16 rows), dmin (fp16 x 16), the 6-bit scales sc[j][r] and
//     mins m[j][r] (u8, 8 x 16 each), unpacked from ggml's 12-byte field as
//     ggml-quants.c's get_scale_min_k4 does.
//   Q6_K, 3360 bytes: per block j, the low 4 bits as for Q4_K (4 vectors) and
//     the high 2 bits in 2 vectors (byte 4r + i of vector h, bits 2m and 2m + 1:
//     element 4 (4h + m) + i's); then d (fp16 x 16), the int8 scales sc[s][r] of
//     the 16-element sub-blocks s = 0..15 (16 x 16).
// (ggml-common.h: block_q4_K {d, dmin, scales[12], qs[128]}, block_q6_K {ql[128],
// qh[64], scales[16], d}; element order as ggml-quants.c's dequantize_row_q4_K /
// dequantize_row_q6_K.)
//
// Arithmetic per (row, token), 32-element blocks b in order (u: the unsigned
// quant, 4 or 6 bits; a, d_a, s_a: quantize_act's block b):
//   Q4_K: isum = sum_i u_i a_i;  acc = fma(float(isum), fl(fl(d sc_b) d_a), acc);
//         macc = fma(-fl(dmin m_b), s_a, macc);  y = acc + macc
//   Q6_K: per half h = 0, 1 (16 elements, scale sc_(2b+h)):
//         isum_h = sum_i u_i a_i - 32 sum_i a_i  (exact int32)
//         acc = fma(float(isum_h), fl(fl(d sc_(2b+h)) d_a), acc);  y = acc
// d sc and dmin m are exact in fp32 (an 11-bit significand times an integer of
// at most 8 bits). One output's bits depend on nothing else in the call.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels_quant_r16k.h"

namespace touchstone::cpu_simd {
namespace {

constexpr int kQ4_K = 12, kQ6_K = 14;  // ggml_type
constexpr size_t kGroup = 16;
constexpr size_t kAhead = 4096;  // software prefetch distance, bytes (as kernels_quant_r16.cpp)

// Record geometry (bytes).
constexpr size_t kRec4 = 2368, kD4 = 2048, kDmin4 = 2080, kSc4 = 2112, kM4 = 2240;
constexpr size_t kRec6 = 3360, kPart6 = 384, kD6 = 3072, kSc6 = 3104;
constexpr size_t kBlk4 = 144, kBlk6 = 210;  // GGUF block bytes

constexpr size_t record(int t) { return t == kQ4_K ? kRec4 : kRec6; }

// ---------------- repacking (scalar, once per model) ----------------

// The 256 unsigned quants of a Q4_K block and its 8 scales / mins.
void unpack_q4k(const uint8_t* blk, uint8_t* e, uint8_t* sc, uint8_t* m) {
  const uint8_t* s = blk + 4;
  const uint8_t* q = blk + 16;
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      sc[j] = s[j] & 63;
      m[j] = s[j + 4] & 63;
    } else {
      sc[j] = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
      m[j] = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      e[64 * c + l] = q[32 * c + l] & 0xF;
      e[64 * c + 32 + l] = q[32 * c + l] >> 4;
    }
}

// The 256 unsigned 6-bit quants of a Q6_K block (value = d * sc[e / 16] * (u - 32)).
void unpack_q6k(const uint8_t* blk, uint8_t* e) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = ql[64 * n + l], hi = ql[64 * n + l + 32], h = qh[32 * n + l];
      e[128 * n + l] = uint8_t((lo & 0xF) | ((h & 3) << 4));
      e[128 * n + l + 32] = uint8_t((hi & 0xF) | (((h >> 2) & 3) << 4));
      e[128 * n + l + 64] = uint8_t((lo >> 4) | (((h >> 4) & 3) << 4));
      e[128 * n + l + 96] = uint8_t((hi >> 4) | (((h >> 6) & 3) << 4));
    }
}

// Row r's 32 quants e of one block into 4 nibble vectors at q.
void put_nibbles(const uint8_t* e, size_t r, uint8_t* q) {
  for (size_t v = 0; v < 4; ++v)
    for (size_t i = 0; i < 4; ++i)
      q[64 * v + 4 * r + i] = uint8_t((e[4 * v + i] & 0xF) | ((e[16 + 4 * v + i] & 0xF) << 4));
}

// Row r's high 2 bits of 32 quants e into 2 vectors at h.
void put_high(const uint8_t* e, size_t r, uint8_t* h) {
  for (size_t hh = 0; hh < 2; ++hh)
    for (size_t i = 0; i < 4; ++i) {
      uint8_t b = 0;
      for (size_t m = 0; m < 4; ++m) b |= uint8_t(((e[4 * (4 * hh + m) + i] >> 4) & 3) << (2 * m));
      h[64 * hh + 4 * r + i] = b;
    }
}

// Row r of the record at rec from its GGUF block blk.
void put_row(int t, const uint8_t* blk, size_t r, uint8_t* rec) {
  uint8_t e[256];
  if (t == kQ4_K) {
    uint8_t sc[8], m[8];
    unpack_q4k(blk, e, sc, m);
    for (size_t j = 0; j < 8; ++j) {
      put_nibbles(e + 32 * j, r, rec + 256 * j);
      rec[kSc4 + 16 * j + r] = sc[j];
      rec[kM4 + 16 * j + r] = m[j];
    }
    std::memcpy(rec + kD4 + 2 * r, blk, 2);
    std::memcpy(rec + kDmin4 + 2 * r, blk + 2, 2);
  } else {
    unpack_q6k(blk, e);
    for (size_t j = 0; j < 8; ++j) {
      put_nibbles(e + 32 * j, r, rec + kPart6 * j);
      put_high(e + 32 * j, r, rec + kPart6 * j + 256);
    }
    for (size_t s = 0; s < 16; ++s) rec[kSc6 + 16 * s + r] = blk[192 + s];
    std::memcpy(rec + kD6 + 2 * r, blk + 208, 2);
  }
}

// ---------------- the kernel ----------------
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

#include "kernels_quant_r16_inl.h"
using r16::bcast4;
using r16::block_isum;

// 16 scales (u8 or int8) times d, in fp32 (exact).
template <bool Signed>
inline __m512 scales(const __m512& d, const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_mul_ps(
      d, _mm512_cvtepi32_ps(Signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v)));
}

// The sums of a block's two 16-element halves of int8 activations.
inline void half_sums(const int8_t* a, int32_t& s0, int32_t& s1) {
  const __m256i x = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)),
                                     _mm256_set1_epi8(char(0x80)));  // a + 128, unsigned
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_sad_epu8(x, _mm256_setzero_si256()));
  s0 = int32_t(v[0] + v[1]) - 16 * 128;
  s1 = int32_t(v[2] + v[3]) - 16 * 128;
}

// Block j of a record: the 8 quad vectors (w[k] pairs with activation quad k).
template <int T>
inline void load_block(const uint8_t* rec, int j, __m512i* w) {
  const __m512i lo = _mm512_set1_epi8(0x0f);
  const uint8_t* q = rec + (T == kQ4_K ? 256 : kPart6) * size_t(j);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    w[v] = _mm512_loadu_si512(q + 64 * v);
    w[4 + v] = _mm512_and_si512(_mm512_srli_epi16(w[v], 4), lo);
    w[v] = _mm512_and_si512(w[v], lo);
  }
  if constexpr (T == kQ6_K) {
    // Quad k's high bits are bits 2m, 2m + 1 (m = k % 4) of vector k / 4: moved
    // to bits 4, 5 and OR-ed in (vpternlogd: w | (h & 0x30)).
    const __m512i b45 = _mm512_set1_epi8(0x30);
    const __m512i h[2] = {_mm512_loadu_si512(q + 256), _mm512_loadu_si512(q + 320)};
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const int m = k % 4;
      const __m512i hk = m < 2 ? _mm512_slli_epi16(h[k / 4], unsigned(4 - 2 * m))
                               : _mm512_srli_epi16(h[k / 4], unsigned(2 * m - 4));
      w[k] = _mm512_ternarylogic_epi32(w[k], hk, b45, 0xF8);  // a | (b & c)
    }
  }
}

// One row group: 16 rows x NT tokens over nsb super-blocks. Y row t at Y + t * ldy.
// Q6_K: off[t][2b + h] = -32 * (the sum of token t's activations in half h of block b).
template <int T, int NT>
void group_tile(const uint8_t* G, size_t nsb, const ActRow* X, const int32_t* off, float* Y,
                size_t ldy) {
  __m512 acc[NT], macc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
  for (size_t k = 0; k < nsb; ++k) {
    const uint8_t* g = G + k * record(T);
    for (size_t o = 0; o < record(T); o += 64) __builtin_prefetch(g + kAhead + o);
    const __m512 d = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + (T == kQ4_K ? kD4 : kD6))));
    for (int j = 0; j < 8; ++j) {
      __m512i w[8];
      load_block<T>(g, j, w);
      const size_t b = 8 * k + size_t(j);
      if constexpr (T == kQ4_K) {
        const __m512 dmin =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + kDmin4)));
        const __m512 dw = scales<false>(d, g + kSc4 + 16 * j);
        const __m512 cw = scales<false>(dmin, g + kM4 + 16 * j);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const __m512i isum = block_isum(w, X[t].qs + b * 32);
          const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(X[t].d[b]));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
          macc[t] = _mm512_fnmadd_ps(cw, _mm512_set1_ps(X[t].s[b]), macc[t]);
        }
      } else {
        const __m512 dw0 = scales<true>(d, g + kSc6 + 32 * j);
        const __m512 dw1 = scales<true>(d, g + kSc6 + 32 * j + 16);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const int8_t* a = X[t].qs + b * 32;
          const int32_t* o = off + size_t(t) * 16 * nsb + 2 * b;
          __m512i s0 = _mm512_set1_epi32(o[0]), s1 = _mm512_set1_epi32(o[1]);
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            s0 = _mm512_dpbusd_epi32(s0, w[q], bcast4(a + 4 * q));
            s1 = _mm512_dpbusd_epi32(s1, w[4 + q], bcast4(a + 16 + 4 * q));
          }
          const __m512 da = _mm512_set1_ps(X[t].d[b]);
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw0, da), acc[t]);
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, da), acc[t]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
    _mm512_storeu_ps(Y + size_t(t) * ldy, T == kQ4_K ? _mm512_add_ps(acc[t], macc[t]) : acc[t]);
}

template <int T>
void gemm_k(const uint8_t* R, size_t nb, size_t r0, size_t r1, const ActRow* X, size_t n_tok,
            float* Y, size_t ldy) {
  const size_t nsb = nb / 8;
  // Q6_K's offset terms, once per call for all row groups (2 per block and token).
  thread_local std::vector<int32_t> off;
  if constexpr (T == kQ6_K) {
    off.resize(n_tok * 2 * nb);
    for (size_t t = 0; t < n_tok; ++t)
      for (size_t b = 0; b < nb; ++b) {
        int32_t h0, h1;
        half_sums(X[t].qs + b * 32, h0, h1);
        off[(t * nb + b) * 2] = -32 * h0;
        off[(t * nb + b) * 2 + 1] = -32 * h1;
      }
  }
  for (size_t g = r0 / kGroup; g < r1 / kGroup; ++g) {
    const uint8_t* G = R + g * nsb * record(T);
    float* y = Y + g * kGroup;
    size_t t = 0;
    auto o = [&](size_t tok) { return T == kQ6_K ? off.data() + tok * 2 * nb : nullptr; };
    for (; t + 8 <= n_tok; t += 8) group_tile<T, 8>(G, nsb, X + t, o(t), y + t * ldy, ldy);
    if (t + 4 <= n_tok) {
      group_tile<T, 4>(G, nsb, X + t, o(t), y + t * ldy, ldy);
      t += 4;
    }
    if (t + 2 <= n_tok) {
      group_tile<T, 2>(G, nsb, X + t, o(t), y + t * ldy, ldy);
      t += 2;
    }
    if (t < n_tok) group_tile<T, 1>(G, nsb, X + t, o(t), y + t * ldy, ldy);
  }
}
#pragma GCC pop_options

}  // namespace

bool r16k_type(int t) { return t == kQ4_K || t == kQ6_K; }

size_t r16k_bytes(int t, size_t n_rows, size_t nb) {
  return (n_rows / kGroup) * (nb / 8) * record(t);
}

void repack_r16k(int t, const uint8_t* W, size_t row_bytes, size_t nb, size_t n_rows,
                 uint8_t* dst) {
  const size_t nsb = nb / 8, bb = t == kQ4_K ? kBlk4 : kBlk6;
  for (size_t g = 0; g < n_rows / kGroup; ++g)
    for (size_t k = 0; k < nsb; ++k) {
      uint8_t* rec = dst + (g * nsb + k) * record(t);
      for (size_t r = 0; r < kGroup; ++r)
        put_row(t, W + (g * kGroup + r) * row_bytes + k * bb, r, rec);
    }
}

void gemm_q_r16k(int t, const uint8_t* R, size_t nb, size_t r0, size_t r1, const ActRow* X,
                 size_t n_tok, float* Y, size_t ldy) {
  if (t == kQ4_K) return gemm_k<kQ4_K>(R, nb, r0, r1, X, n_tok, Y, ldy);
  return gemm_k<kQ6_K>(R, nb, r0, r1, X, n_tok, Y, ldy);
}

}  // namespace touchstone::cpu_simd
