// r16_test.cpp - the row-interleaved int8 kernel (kernels_quant_r16.cpp)
// against a scalar rendering of its documented arithmetic, bit for bit, and
// its independence of the row range and the token count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"
#include "touchstone/model/quant.h"

namespace {

namespace gg = touchstone::gguf;
using namespace touchstone::cpu_simd;

std::vector<uint8_t> blocks(QType t, size_t n_rows, size_t nb, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t bb = qtype_block_bytes(t);
  std::vector<uint8_t> w(n_rows * nb * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  for (size_t i = 0; i < n_rows * nb; ++i) {
    uint8_t* b = w.data() + i * bb;
    for (size_t j = 0; j < bb; ++j) b[j] = uint8_t(byte(rng));
    const uint16_t d = gg::fp32_to_fp16(sc(rng));
    std::memcpy(b, &d, 2);
    if (t == QType::Q4_1) {
      const uint16_t m = gg::fp32_to_fp16(-8.0f * sc(rng));
      std::memcpy(b + 2, &m, 2);
    }
  }
  return w;
}

float h(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return gg::fp16_to_fp32(v);
}

// The arithmetic kernels.h documents for gemm_q_r16, one output at a time.
float expected(QType t, const uint8_t* row, size_t nb, const ActRow& a) {
  const size_t bb = qtype_block_bytes(t);
  float acc = 0.0f, macc = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * bb;
    const int8_t* x = a.qs + b * 32;
    int32_t isum = 0;
    float c = 0.0f;
    if (t == QType::Q8_0) {
      for (int i = 0; i < 32; ++i) isum += (int32_t(int8_t(blk[2 + i])) + 128) * x[i];
      c = -128.0f * h(blk);
    } else {
      const uint8_t* q = blk + (t == QType::Q4_1 ? 4 : 2);
      for (int i = 0; i < 16; ++i) isum += (q[i] & 0x0f) * x[i] + (q[i] >> 4) * x[i + 16];
      c = t == QType::Q4_1 ? h(blk + 2) : -8.0f * h(blk);
    }
    const float scale = h(blk) * a.d[b];
    acc = std::fma(float(isum), scale, acc);
    macc = std::fma(c, a.s[b], macc);
  }
  return acc + macc;
}

class R16 : public ::testing::TestWithParam<QType> {
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
  const QType t = GetParam();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (size_t n_in : {32u, 96u, 576u}) {
    const size_t rows = 48, n_tok = 15, nb = n_in / 32, bb = qtype_block_bytes(t);
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

INSTANTIATE_TEST_SUITE_P(Types, R16, ::testing::Values(QType::Q4_0, QType::Q4_1, QType::Q8_0),
                         [](const auto& pi) {
                           return pi.param == QType::Q4_0   ? std::string("Q4_0")
                                  : pi.param == QType::Q4_1 ? std::string("Q4_1")
                                                            : std::string("Q8_0");
                         });

}  // namespace
