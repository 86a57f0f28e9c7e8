// quant_test.cpp - one hand-built block per type, every output checked.
//
// Each test packs known quants/scales following the layout comments of
// ggml-common.h, then checks every dequantized value against the formula
// computed directly per element (d, m and scales are chosen so that all
// products are exact in fp32).
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"

namespace touchstone::gguf {
namespace {

constexpr uint16_t kHalf = 0x3800;      // 0.5
constexpr uint16_t kQuarter = 0x3400;   // 0.25
constexpr uint16_t kMinusOne = 0xBC00;  // -1.0
constexpr uint16_t kOne = 0x3C00;       // 1.0
constexpr uint16_t kEighth = 0x3000;    // 0.125

template <typename Block>
std::vector<float> run(TensorType t, const Block& b, int n) {
  std::vector<uint8_t> bytes(sizeof(Block));
  std::memcpy(bytes.data(), &b, sizeof(Block));
  std::vector<float> y(static_cast<size_t>(n), -12345.0f);
  dequantize_row(t, bytes.data(), y.data(), n);
  return y;
}

TEST(Quant, TypeTraits) {
  EXPECT_EQ(type_traits(TensorType::Q4_0).type_size, 18u);
  EXPECT_EQ(type_traits(TensorType::Q4_1).type_size, 20u);
  EXPECT_EQ(type_traits(TensorType::Q8_0).type_size, 34u);
  EXPECT_EQ(type_traits(TensorType::Q4_K).type_size, 144u);
  EXPECT_EQ(type_traits(TensorType::Q6_K).type_size, 210u);
  EXPECT_EQ(type_traits(TensorType::Q4_K).block_size, 256u);
  EXPECT_EQ(type_traits(TensorType::BF16).type_size, 2u);
  EXPECT_FALSE(type_traits(TensorType::F32).quantized);
  EXPECT_EQ(type_name(TensorType::Q4_1), "Q4_1");
  EXPECT_EQ(type_name(static_cast<TensorType>(4)), "type#4");
  EXPECT_EQ(type_name(static_cast<TensorType>(999)), "type#999");
  EXPECT_THROW(type_traits(static_cast<TensorType>(5)), Error);
  EXPECT_THROW(type_traits(static_cast<TensorType>(1000)), Error);
  EXPECT_TRUE(can_dequantize(TensorType::Q6_K));
  EXPECT_FALSE(can_dequantize(TensorType::IQ2_XXS));
}

TEST(Quant, RowLengthMustBeMultipleOfBlock) {
  std::vector<uint8_t> src(64);
  std::vector<float> dst(64);
  EXPECT_THROW(dequantize_row(TensorType::Q4_0, src.data(), dst.data(), 31), Error);
  EXPECT_THROW(dequantize_row(TensorType::IQ2_XXS, src.data(), dst.data(), 256), Error);
  EXPECT_NO_THROW(dequantize_row(TensorType::Q4_0, src.data(), dst.data(), 0));
}

TEST(Quant, F32F16BF16) {
  const float f[3] = {1.5f, -2.0f, 0.0f};
  float y[3];
  dequantize_row(TensorType::F32, f, y, 3);
  EXPECT_EQ(y[1], -2.0f);
  const uint16_t h[3] = {kHalf, kMinusOne, 0x7C00};
  dequantize_row(TensorType::F16, h, y, 3);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], -1.0f);
  EXPECT_TRUE(std::isinf(y[2]));
  const uint16_t b[2] = {0x3F80, 0xC040};
  dequantize_row(TensorType::BF16, b, y, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -3.0f);
}

TEST(Quant, Q4_0) {
  block_q4_0 b{};
  b.d = kHalf;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((j & 0xF) | (((15 - j) & 0xF) << 4));
  const auto y = run(TensorType::Q4_0, b, 32);
  EXPECT_EQ(y[0], -4.0f);  // (0 - 8) * 0.5
  EXPECT_EQ(y[16], 3.5f);  // (15 - 8) * 0.5
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], static_cast<float>(j - 8) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], static_cast<float>(15 - j - 8) * 0.5f) << j;
  }
}

TEST(Quant, Q4_1) {
  block_q4_1 b{};
  b.d = kQuarter;
  b.m = kMinusOne;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((j ^ 5) << 4));
  const auto y = run(TensorType::Q4_1, b, 32);
  // Low nibbles -> first 16 outputs, high nibbles -> last 16: y = d*q + m.
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[15], 2.75f);  // 15*0.25 - 1
  EXPECT_EQ(y[16], 0.25f);  // (0^5)=5 -> 5*0.25 - 1
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], static_cast<float>(j) * 0.25f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], static_cast<float>(j ^ 5) * 0.25f - 1.0f) << j;
  }
}

TEST(Quant, Q5_0) {
  block_q5_0 b{};
  b.d = kHalf;
  const uint32_t qh = 0xA5C3F00Fu;
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j)
    b.qs[j] = static_cast<uint8_t>((j * 7) & 0xF) | static_cast<uint8_t>(((j * 3) & 0xF) << 4);
  const auto y = run(TensorType::Q5_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    // Element j takes bit j of qh as its 5th bit, element j+16 takes bit j+16.
    const int q0 = ((j * 7) & 0xF) | (((qh >> j) & 1) << 4);
    const int q1 = ((j * 3) & 0xF) | (((qh >> (j + 16)) & 1) << 4);
    EXPECT_EQ(y[j], static_cast<float>(q0 - 16) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], static_cast<float>(q1 - 16) * 0.5f) << j;
  }
}

TEST(Quant, Q5_1) {
  block_q5_1 b{};
  b.d = kQuarter;
  b.m = kMinusOne;
  const uint32_t qh = 0x0F0FF0F0u;
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((15 - j) | (j << 4));
  const auto y = run(TensorType::Q5_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    const int q0 = (15 - j) | (((qh >> j) & 1) << 4);
    const int q1 = j | (((qh >> (j + 16)) & 1) << 4);
    EXPECT_EQ(y[j], static_cast<float>(q0) * 0.25f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], static_cast<float>(q1) * 0.25f - 1.0f) << j;
  }
}

TEST(Quant, Q8_0) {
  block_q8_0 b{};
  b.d = kEighth;
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 9 - 128);
  b.qs[31] = 127;
  const auto y = run(TensorType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[31], 15.875f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], static_cast<float>(b.qs[j]) * 0.125f) << j;
}

// Q4_K / Q5_K pack 8 (scale, min) 6-bit pairs in 12 bytes (get_scale_min_k4).
void pack_k4_scales(const int sc[8], const int mn[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

TEST(Quant, Q4_K) {
  const int sc[8] = {1, 63, 17, 32, 48, 5, 60, 33};
  const int mn[8] = {0, 7, 63, 40, 16, 31, 2, 50};
  block_q4_K b{};
  b.d = kHalf;
  b.dmin = kQuarter;
  pack_k4_scales(sc, mn, b.scales);
  auto q_of = [](int e) { return (e * 5 + e / 32) & 0xF; };
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;  // sub-block: 32 elements share a (scale, min)
    uint8_t& byte = b.qs[(s / 2) * 32 + e % 32];
    byte = static_cast<uint8_t>(byte | (q_of(e) << ((s % 2) * 4)));  // even sub-block: low nibble
  }
  const auto y = run(TensorType::Q4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const float want = 0.5f * static_cast<float>(sc[s]) * static_cast<float>(q_of(e)) -
                       0.25f * static_cast<float>(mn[s]);
    EXPECT_EQ(y[e], want) << e;
  }
}

TEST(Quant, Q5_K) {
  const int sc[8] = {9, 1, 63, 32, 48, 5, 60, 33};
  const int mn[8] = {3, 7, 63, 40, 16, 31, 2, 0};
  block_q5_K b{};
  b.d = kHalf;
  b.dmin = kQuarter;
  pack_k4_scales(sc, mn, b.scales);
  auto q_of = [](int e) { return (e * 11 + e / 7) & 0x1F; };
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    uint8_t& lo = b.qs[(s / 2) * 32 + e % 32];
    lo = static_cast<uint8_t>(lo | ((q_of(e) & 0xF) << ((s % 2) * 4)));
    b.qh[e % 32] = static_cast<uint8_t>(b.qh[e % 32] | ((q_of(e) >> 4) << s));  // bit s = 5th bit
  }
  const auto y = run(TensorType::Q5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const float want = 0.5f * static_cast<float>(sc[s]) * static_cast<float>(q_of(e)) -
                       0.25f * static_cast<float>(mn[s]);
    EXPECT_EQ(y[e], want) << e;
  }
}

TEST(Quant, Q6_K) {
  block_q6_K b{};
  b.d = kHalf;
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i * 17 - 128);
  auto q_of = [](int e) { return (e * 13 + e / 64) & 0x3F; };
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
    uint8_t& lo = b.ql[n * 64 + l + (k & 1) * 32];
    lo = static_cast<uint8_t>(lo | ((q_of(e) & 0xF) << ((k / 2) * 4)));
    uint8_t& hi = b.qh[n * 32 + l];
    hi = static_cast<uint8_t>(hi | ((q_of(e) >> 4) << (2 * k)));
  }
  const auto y = run(TensorType::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const float want =
        0.5f * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q_of(e) - 32);
    EXPECT_EQ(y[e], want) << e;
  }
}

TEST(Quant, Q2_K) {
  block_q2_K b{};
  b.d = kHalf;
  b.dmin = kQuarter;
  for (int i = 0; i < 16; ++i)
    b.scales[i] =
        static_cast<uint8_t>((i * 5 + 1) & 0xF) | static_cast<uint8_t>(((i * 3) & 0xF) << 4);
  auto q_of = [](int e) { return (e * 3 + e / 16) & 3; };
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128, j = r / 32;
    uint8_t& q = b.qs[n * 32 + r % 32];
    q = static_cast<uint8_t>(q | (q_of(e) << (2 * j)));
  }
  const auto y = run(TensorType::Q2_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const uint8_t s = b.scales[e / 16];
    const float want = 0.5f * static_cast<float>(s & 0xF) * static_cast<float>(q_of(e)) -
                       0.25f * static_cast<float>(s >> 4);
    EXPECT_EQ(y[e], want) << e;
  }
}

TEST(Quant, Q3_K) {
  block_q3_K b{};
  b.d = kHalf;
  int s6[16];
  for (int i = 0; i < 16; ++i) {
    s6[i] = (i * 23 + 3) & 63;
    // Low nibble in byte i%8 (nibble i/8); top 2 bits in byte 8+i%4 at bit 2*(i/4).
    b.scales[i % 8] = static_cast<uint8_t>(b.scales[i % 8] | ((s6[i] & 0xF) << (4 * (i / 8))));
    b.scales[8 + i % 4] =
        static_cast<uint8_t>(b.scales[8 + i % 4] | ((s6[i] >> 4) << (2 * (i / 4))));
  }
  auto q_of = [](int e) { return (e * 7 + e / 32) & 7; };  // 3-bit quant 0..7, value = q - 4
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
    uint8_t& q = b.qs[n * 32 + l];
    q = static_cast<uint8_t>(q | ((q_of(e) & 3) << (2 * j)));
    // High bit set means "no -4 offset".
    b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | ((q_of(e) >> 2) << (n * 4 + j)));
  }
  const auto y = run(TensorType::Q3_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const float want = 0.5f * static_cast<float>(s6[e / 16] - 32) * static_cast<float>(q_of(e) - 4);
    EXPECT_EQ(y[e], want) << e;
  }
}

TEST(Quant, Q8_K) {
  block_q8_K b{};
  b.d = 0.0625f;
  for (int j = 0; j < 256; ++j) b.qs[j] = static_cast<int8_t>(j - 128);
  const auto y = run(TensorType::Q8_K, b, 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], static_cast<float>(j - 128) * 0.0625f) << j;
}

// MXFP4: ggml-common.h kvalues_mxfp4 and ggml-impl.h ggml_e8m0_to_fp32_half, copied here
// from llama.cpp (llama-cpp-python 0.3.16) so a change to either table shows.
TEST(Quant, Mxfp4TablesAreGgmls) {
  const int8_t ggml_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kvalues_mxfp4[i], ggml_kvalues_mxfp4[i]) << i;
  // e2m1 (OCP MX v1.0): sign, 2 exponent bits (bias 1), 1 mantissa bit; doubled.
  for (int code = 0; code < 16; ++code) {
    const int e = (code >> 1) & 3, m = code & 1;
    const double v = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
    EXPECT_EQ(static_cast<double>(kvalues_mxfp4[code]), (code & 8 ? -2.0 : 2.0) * v) << code;
  }
  EXPECT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_fp32_half(2), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(128), 1.0f);
  EXPECT_EQ(e8m0_to_fp32_half(255), std::ldexp(1.0f, 127));
  EXPECT_EQ(type_traits(TensorType::MXFP4).type_size, 17u);
  EXPECT_EQ(type_traits(TensorType::MXFP4).block_size, 32u);
  EXPECT_TRUE(can_dequantize(TensorType::MXFP4));
}

TEST(Quant, Mxfp4) {
  block_mxfp4 b[2]{};
  b[0].e = 130;  // d = 2^(130 - 128) = 4
  b[1].e = 1;    // d = 2^-127, subnormal
  for (int j = 0; j < 16; ++j) {
    b[0].qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    b[1].qs[j] = static_cast<uint8_t>(7 | (15 << 4));
  }
  std::vector<uint8_t> bytes(sizeof(b));
  std::memcpy(bytes.data(), b, sizeof(b));
  std::vector<float> y(64, -1.0f);
  dequantize_row(TensorType::MXFP4, bytes.data(), y.data(), 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 4.0f * kvalues_mxfp4[j]) << j;            // low nibble: element j
    EXPECT_EQ(y[j + 16], 4.0f * kvalues_mxfp4[15 - j]) << j;  // high nibble: element j + 16
    EXPECT_EQ(y[32 + j], 12.0f * std::ldexp(1.0f, -127)) << j;
    EXPECT_EQ(y[48 + j], -12.0f * std::ldexp(1.0f, -127)) << j;
  }
  EXPECT_EQ(y[7], 48.0f);
  EXPECT_EQ(y[16], -48.0f);
  EXPECT_THROW(dequantize_row(TensorType::MXFP4, bytes.data(), y.data(), 48), Error);
}

TEST(Quant, MultipleBlocksUnaligned) {
  // Two Q4_1 blocks at an odd address: dequantize_row needs no alignment.
  block_q4_1 blocks[2]{};
  blocks[0].d = kOne;
  blocks[1].d = kHalf;
  for (int j = 0; j < 16; ++j) blocks[0].qs[j] = blocks[1].qs[j] = 0x31;
  std::vector<uint8_t> buf(1 + sizeof(blocks));
  std::memcpy(buf.data() + 1, blocks, sizeof(blocks));
  std::vector<float> y(64);
  dequantize_row(TensorType::Q4_1, buf.data() + 1, y.data(), 64);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[16], 3.0f);
  EXPECT_EQ(y[32], 0.5f);
  EXPECT_EQ(y[63], 1.5f);
}

}  // namespace
}  // namespace touchstone::gguf
