// random_blocks.h - random GGUF blocks for the kernel tests: random bytes with
// valid fp16 scale fields.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
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

// Blocks of any GGUF type the generic kernel takes (F16, Q5_0, Q2_K, Q4_K,
// Q5_K, Q6_K, MXFP4) for n_elems elements: random bytes, with the fp16 scale
// fields small positive numbers (~0.004 .. 0.008) and MXFP4's E8M0 scale byte
// 2^-10 .. 2^-2; every bit pattern of the quant fields is valid.
inline std::vector<uint8_t> random_blocks(touchstone::gguf::TensorType t, size_t n_elems,
                                          uint32_t seed) {
  namespace gg = touchstone::gguf;
  using gg::TensorType;
  const gg::TypeTraits& tr = gg::type_traits(t);
  std::mt19937 rng(seed);
  std::vector<uint8_t> out;
  if (t == TensorType::F16) {
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (size_t i = 0; i < n_elems; ++i) {
      const uint16_t h = gg::fp32_to_fp16(nd(rng));
      out.push_back(uint8_t(h));
      out.push_back(uint8_t(h >> 8));
    }
    return out;
  }
  const size_t nb = n_elems / tr.block_size;
  out.resize(nb * tr.type_size);
  for (auto& b : out) b = uint8_t(rng());
  auto half = [&](uint8_t* p) {
    const uint16_t h = uint16_t(0x1c00u | (rng() & 0x3ffu));
    p[0] = uint8_t(h);
    p[1] = uint8_t(h >> 8);
  };
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* blk = out.data() + b * tr.type_size;
    switch (t) {
      case TensorType::Q4_K:  // {d, dmin, scales[12], qs[128]}
      case TensorType::Q5_K:
      case TensorType::Q2_K:
        half(blk);
        half(blk + 2);
        if (t == TensorType::Q2_K) {  // {scales[16], qs[64], d, dmin}
          half(blk + 80);
          half(blk + 82);
        }
        break;
      case TensorType::Q6_K:  // {ql[128], qh[64], scales[16], d}
        half(blk + 208);
        break;
      case TensorType::Q5_0:  // {d, qh[4], qs[16]}
        half(blk);
        break;
      case TensorType::MXFP4:  // {e, qs[16]}: scales 2^-10 .. 2^-2 (e8m0_to_fp32_half)
        blk[0] = uint8_t(118 + rng() % 9);
        break;
      default:
        throw std::invalid_argument(
            std::string("random_blocks: no generator for ").append(gg::type_name(t)));
    }
  }
  return out;
}

}  // namespace touchstone::cpu_simd::test
