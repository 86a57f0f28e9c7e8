// r16_test.cpp - the row-interleaved int8 kernel (kernels_quant_r16.cpp)
// against a scalar rendering of its documented arithmetic, bit for bit, and
// its independence of the row range and the token count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"
#include "random_blocks.h"
#include "touchstone/model/quant.h"

namespace {

namespace gg = touchstone::gguf;
using namespace touchstone::cpu_simd;

using test::block_bytes;
using test::kQ4_0;
using test::kQ4_1;
using test::kQ5_0;
using test::kQ8_0;
std::vector<uint8_t> blocks(int t, size_t n_rows, size_t nb, uint32_t seed) {
  return test::random_blocks(t, n_rows, nb, seed);
}

float h(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return gg::fp16_to_fp32(v);
}

// The arithmetic kernels.h documents for gemm_q_r16, one output at a time,
// from the GGUF blocks as ggml-common.h lays them out.
float expected(int t, const uint8_t* row, size_t nb, const ActRow& a) {
  const size_t bb = block_bytes(t);
  float acc = 0.0f, macc = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * bb;
    const int8_t* x = a.qs + b * 32;
    int32_t isum = 0;
    float c = 0.0f;
    if (t == kQ8_0) {
      for (int i = 0; i < 32; ++i) isum += (int32_t(int8_t(blk[2 + i])) + 128) * x[i];
      c = -128.0f * h(blk);
    } else if (t == kQ5_0) {  // {d, qh[4], qs[16]}: u = nibble | fifth bit << 4
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      const uint8_t* q = blk + 6;
      for (int i = 0; i < 16; ++i) {
        const int lo = (q[i] & 0x0f) | int((qh >> i) & 1u) << 4;
        const int hi = (q[i] >> 4) | int((qh >> (i + 16)) & 1u) << 4;
        isum += lo * x[i] + hi * x[i + 16];
      }
      c = -16.0f * h(blk);
    } else {
      const uint8_t* q = blk + (t == kQ4_1 ? 4 : 2);
      for (int i = 0; i < 16; ++i) isum += (q[i] & 0x0f) * x[i] + (q[i] >> 4) * x[i + 16];
      c = t == kQ4_1 ? h(blk + 2) : -8.0f * h(blk);
    }
    const float scale = h(blk) * a.d[b];
    acc = std::fma(float(isum), scale, acc);
    macc = std::fma(c, a.s[b], macc);
  }
  return acc + macc;
}

class R16 : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (qlevel_best() != QLevel::AVX512VNNI)
      GTEST_SKIP() << "the r16 kernel is AVX-512 VNNI only; this CPU's best int8 level is "
                   << qlevel_name(qlevel_best());
    force_qlevel(QLevel::AVX512VNNI);
  }
  void TearDown() override { force_qlevel(qlevel_best()); }
};

TEST_P(R16, MatchesItsArithmeticBitForBitForAnyRowsAndTokens) {
  const int t = GetParam();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (size_t n_in : {32u, 96u, 576u}) {
    const size_t rows = 48, n_tok = 15, nb = n_in / 32, bb = block_bytes(t);
    const auto W = blocks(t, rows, nb, uint32_t(n_in));
    std::vector<uint8_t> R(r16_bytes(t, rows, nb));
    repack_r16(t, W.data(), nb * bb, nb, rows, R.data());
    std::vector<int8_t> qs(n_tok * n_in);
    std::vector<float> d(n_tok * nb), s(n_tok * nb), x(n_in);
    std::vector<ActRow> X(n_tok);
    for (size_t k = 0; k < n_tok; ++k) {
      for (float& v : x) v = u(rng);
      X[k] = ActRow{qs.data() + k * n_in, d.data() + k * nb, s.data() + k * nb};
      quantize_act(x.data(), n_in, X[k]);
    }
    std::vector<float> Y(n_tok * rows, NAN);
    gemm_q_r16(t, R.data(), nb, 0, rows, X.data(), n_tok, Y.data(), rows);  // tiles 8 + 4 + 2 + 1
    for (size_t k = 0; k < n_tok; ++k)
      for (size_t r = 0; r < rows; ++r)
        ASSERT_EQ(Y[k * rows + r], expected(t, W.data() + r * nb * bb, nb, X[k]))
            << "n_in " << n_in << " row " << r << " token " << k;
    // One token, one row group in the middle: the same bits.
    for (size_t k = 0; k < n_tok; ++k) {
      std::vector<float> y1(rows, NAN);
      gemm_q_r16(t, R.data(), nb, 16, 32, X.data() + k, 1, y1.data(), rows);
      for (size_t r = 16; r < 32; ++r) EXPECT_EQ(y1[r], Y[k * rows + r]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, R16, ::testing::Values(kQ4_0, kQ4_1, kQ5_0, kQ8_0),
                         [](const auto& pi) {
                           return pi.param == kQ4_0   ? std::string("Q4_0")
                                  : pi.param == kQ4_1 ? std::string("Q4_1")
                                  : pi.param == kQ5_0 ? std::string("Q5_0")
                                                      : std::string("Q8_0");
                         });

// Q5_0 through the dequantizer: a block whose fifth bits are all set and all
// clear gives u - 16 = the dequantized value / d for every element (the
// layout's bit bookkeeping against ggml's).
TEST(R16Q5, FifthBitsMatchTheDequantizer) {
  if (qlevel_best() != QLevel::AVX512VNNI) GTEST_SKIP() << "AVX-512 VNNI only";
  force_qlevel(QLevel::AVX512VNNI);
  const size_t rows = 16, nb = 2, n_in = 64;
  auto W = blocks(kQ5_0, rows, nb, 9);
  std::vector<float> wf(rows * n_in);
  gg::dequantize_row(gg::TensorType::Q5_0, W.data(), wf.data(), int64_t(rows * n_in));
  std::vector<uint8_t> R(r16_bytes(kQ5_0, rows, nb));
  repack_r16(kQ5_0, W.data(), nb * 22, nb, rows, R.data());
  // One-hot activations (x_i = 127 at a single i, d_a = 1/127 ... exact): y = w_i.
  for (size_t i = 0; i < n_in; ++i) {
    std::vector<int8_t> qs(n_in, 0);
    qs[i] = 1;
    std::vector<float> d(nb, 1.0f), s(nb, 0.0f);
    s[i / 32] = 1.0f;  // s = d * sum(q)
    const ActRow X{qs.data(), d.data(), s.data()};
    std::vector<float> y(rows);
    gemm_q_r16(kQ5_0, R.data(), nb, 0, rows, &X, 1, y.data(), rows);
    for (size_t r = 0; r < rows; ++r)
      ASSERT_EQ(y[r], wf[r * n_in + i]) << "row " << r << " i " << i;
  }
  force_qlevel(qlevel_best());
}

}  // namespace
