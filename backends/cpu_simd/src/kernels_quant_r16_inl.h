// kernels_quant_r16_inl.h - what the row-interleaved int8 kernels share
// (kernels_quant_r16.cpp, kernels_quant_r16k.cpp). Included inside their
// namespace and AVX-512 VNNI `#pragma GCC target` region, after <immintrin.h>,
// <cstdint> and <cstring>; it declares namespace r16 there.
#pragma once

namespace r16 {

// 4 activation bytes broadcast to every 32-bit lane.
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The exact int32 sums of one 32-element block for 16 rows (lane r = row r):
// w[k] holds quad k (elements 4k .. 4k + 3) of every row as unsigned bytes, a
// the block's 32 int8 activations. Two dependency chains (even / odd quads).
inline __m512i block_isum(const __m512i* w, const int8_t* a) {
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(a));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(a + 4));
#pragma GCC unroll 3
  for (int k = 2; k < 8; k += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w[k], bcast4(a + 4 * k));
    s1 = _mm512_dpbusd_epi32(s1, w[k + 1], bcast4(a + 4 * k + 4));
  }
  return _mm512_add_epi32(s0, s1);
}

}  // namespace r16
