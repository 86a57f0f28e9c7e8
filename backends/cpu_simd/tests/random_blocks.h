// random_blocks.h - random GGUF blocks of the 32-element formats for the
// kernel tests: random bytes with a valid fp16 d (and m for Q4_1) in front.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "touchstone/model/quant.h"

namespace touchstone::cpu_simd::test {

inline constexpr int kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8;  // ggml types

inline size_t block_bytes(int t) {
  return t == kQ4_0 ? 18 : t == kQ4_1 ? 20 : t == kQ5_0 ? 22 : 34;
}

// n_rows rows of nb blocks of ggml type t (Q4_0, Q4_1, Q5_0, Q8_0).
inline std::vector<uint8_t> random_blocks(int t, size_t n_rows, size_t nb, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t bb = block_bytes(t);
  std::vector<uint8_t> w(n_rows * nb * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  for (size_t i = 0; i < n_rows * nb; ++i) {
    uint8_t* b = w.data() + i * bb;
    for (size_t j = 0; j < bb; ++j) b[j] = uint8_t(byte(rng));
    const uint16_t d = touchstone::gguf::fp32_to_fp16(sc(rng));
    std::memcpy(b, &d, 2);
    if (t == kQ4_1) {
      const uint16_t m = touchstone::gguf::fp32_to_fp16(-8.0f * sc(rng));
      std::memcpy(b + 2, &m, 2);
    }
  }
  return w;
}

}  // namespace touchstone::cpu_simd::test
