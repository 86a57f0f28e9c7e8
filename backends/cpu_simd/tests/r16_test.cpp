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
constexpr int kQ4_K = 12, kQ6_K = 14;
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
float expected_k(int t, const uint8_t* row, size_t nb, const ActRow& a);

float expected(int t, const uint8_t* row, size_t nb, const ActRow& a) {
  if (t == kQ4_K || t == kQ6_K) return expected_k(t, row, nb, a);
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

// The unsigned quants u (value = d sc (u - 32) for Q6_K, d sc u - dmin m for
// Q4_K) of element e of a K-quant block, and its scale and min, read as
// ggml-quants.c's dequantize_row_q4_K / q6_K read them.
struct KElem {
  int u, sc, m;
};
KElem k_elem(int t, const uint8_t* blk, int e) {
  if (t == kQ6_K) {                                            // {ql[128], qh[64], scales[16], d}
    const int n = e / 128, l = e % 32, part = (e % 128) / 32;  // part: q1..q4
    const uint8_t ql = blk[64 * n + l + (part & 1) * 32], qh = blk[128 + 32 * n + l];
    const int lo = part < 2 ? ql & 0xF : ql >> 4;
    return {lo | ((qh >> (2 * part)) & 3) << 4, int(int8_t(blk[192 + e / 16])), 0};
  }
  const uint8_t* s = blk + 4;  // {d, dmin, scales[12], qs[128]}
  const int j = e / 32, c = e / 64, l = e % 32;
  const int u = (e % 64) < 32 ? blk[16 + 32 * c + l] & 0xF : blk[16 + 32 * c + l] >> 4;
  if (j < 4) return {u, s[j] & 63, s[j + 4] & 63};
  return {u, (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4};
}

// kernels_quant_r16k.cpp's documented arithmetic, one output at a time.
float expected_k(int t, const uint8_t* row, size_t nb, const ActRow& a) {
  const size_t bb = t == kQ4_K ? 144 : 210;
  float acc = 0.0f, macc = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + (b / 8) * bb;
    const int e0 = int(b % 8) * 32;
    const int8_t* x = a.qs + b * 32;
    if (t == kQ6_K) {
      for (int half = 0; half < 2; ++half) {
        int32_t isum = 0;
        for (int i = 16 * half; i < 16 * half + 16; ++i)
          isum += (k_elem(t, blk, e0 + i).u - 32) * x[i];
        const float dsc = h(blk + 208) * float(k_elem(t, blk, e0 + 16 * half).sc);
        acc = std::fma(float(isum), dsc * a.d[b], acc);
      }
      continue;
    }
    int32_t isum = 0;
    for (int i = 0; i < 32; ++i) isum += k_elem(t, blk, e0 + i).u * x[i];
    const KElem s = k_elem(t, blk, e0);
    acc = std::fma(float(isum), (h(blk) * float(s.sc)) * a.d[b], acc);
    macc = std::fma(-(h(blk + 2) * float(s.m)), a.s[b], macc);
  }
  return t == kQ6_K ? acc : acc + macc;
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
  const bool kq = t == kQ4_K || t == kQ6_K;
  for (size_t n_in : kq ? std::vector<size_t>{256, 768} : std::vector<size_t>{32, 96, 576}) {
    const size_t rows = 48, n_tok = 15, nb = n_in / 32;
    const auto W = kq ? test::random_blocks(gg::TensorType(t), rows * n_in, uint32_t(n_in))
                      : blocks(t, rows, nb, uint32_t(n_in));
    const size_t row_bytes = W.size() / rows;
    std::vector<uint8_t> R(r16_bytes(t, rows, nb));
    repack_r16(t, W.data(), row_bytes, nb, rows, R.data());
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
        ASSERT_EQ(Y[k * rows + r], expected(t, W.data() + r * row_bytes, nb, X[k]))
            << "n_in " << n_in << " row " << r << " token " << k;
    // One token, one row group in the middle: the same bits.
    for (size_t k = 0; k < n_tok; ++k) {
      std::vector<float> y1(rows, NAN);
      gemm_q_r16(t, R.data(), nb, 16, 32, X.data() + k, 1, y1.data(), rows);
      for (size_t r = 16; r < 32; ++r) EXPECT_EQ(y1[r], Y[k * rows + r]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, R16, ::testing::Values(kQ4_0, kQ4_1, kQ5_0, kQ8_0, kQ4_K, kQ6_K),
                         [](const auto& pi) {
                           return std::string(gg::type_name(gg::TensorType(pi.param)));
                         });

// Through the dequantizer: with one-hot activations (q_i = 1, d_a = 1, s_a = 1
// in q_i's block) the output is the dequantized weight w_i itself, for every
// element i: the layout's bookkeeping of nibbles, fifth / high bits, scales
// and mins against ggml's own reading of the blocks.
class R16OneHot : public R16 {};

TEST_P(R16OneHot, OutputsAreTheDequantizedWeights) {
  const int t = GetParam();
  const size_t rows = 16, n_in = 512, nb = n_in / 32;
  const auto tt = gg::TensorType(t);
  const auto W = test::random_blocks(tt, rows * n_in, 9);
  std::vector<float> wf(rows * n_in);
  gg::dequantize_row(tt, W.data(), wf.data(), int64_t(rows * n_in));
  std::vector<uint8_t> R(r16_bytes(t, rows, nb));
  repack_r16(t, W.data(), W.size() / rows, nb, rows, R.data());
  for (size_t i = 0; i < n_in; ++i) {
    std::vector<int8_t> qs(n_in, 0);
    qs[i] = 1;
    std::vector<float> d(nb, 1.0f), s(nb, 0.0f);
    s[i / 32] = 1.0f;  // s = d * sum(q)
    const ActRow X{qs.data(), d.data(), s.data()};
    std::vector<float> y(rows);
    gemm_q_r16(t, R.data(), nb, 0, rows, &X, 1, y.data(), rows);
    for (size_t r = 0; r < rows; ++r)
      ASSERT_EQ(y[r], wf[r * n_in + i]) << "row " << r << " i " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, R16OneHot, ::testing::Values(kQ5_0, kQ4_K, kQ6_K),
                         [](const auto& pi) {
                           return std::string(gg::type_name(gg::TensorType(pi.param)));
                         });

}  // namespace
