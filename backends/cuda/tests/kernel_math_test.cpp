// kernel_math_test.cpp - the CUDA kernels' per-element / per-block maths
// (touchstone/cuda/kernel_math.h), tested on the host with g++: no GPU needed.
// Reference: touchstone::gguf::dequantize_row / fp32_to_fp16, touchstone::ops
// (scalar_ops.h) and the formulas of reference/transformer/src/reference_forward.cpp
// (restated here where they are private).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "touchstone/cuda/kernel_math.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"

namespace {

namespace cm = touchstone::cuda_math;
namespace gg = touchstone::gguf;

// ---- block layouts -------------------------------------------------------------------
static_assert(sizeof(cm::blk_q4_0) == sizeof(gg::block_q4_0));
static_assert(sizeof(cm::blk_q4_1) == sizeof(gg::block_q4_1));
static_assert(sizeof(cm::blk_q5_0) == sizeof(gg::block_q5_0));
static_assert(offsetof(cm::blk_q5_0, qh) == offsetof(gg::block_q5_0, qh));
static_assert(offsetof(cm::blk_q5_0, qs) == offsetof(gg::block_q5_0, qs));
static_assert(static_cast<int>(cm::WType::Q5_0) == static_cast<int>(gg::TensorType::Q5_0));
static_assert(sizeof(cm::blk_q8_0) == sizeof(gg::block_q8_0));
static_assert(sizeof(cm::blk_q4_K) == sizeof(gg::block_q4_K));
static_assert(sizeof(cm::blk_q6_K) == sizeof(gg::block_q6_K));
static_assert(offsetof(cm::blk_q4_1, qs) == offsetof(gg::block_q4_1, qs));
static_assert(offsetof(cm::blk_q4_K, scales) == offsetof(gg::block_q4_K, scales));
static_assert(offsetof(cm::blk_q4_K, qs) == offsetof(gg::block_q4_K, qs));
static_assert(offsetof(cm::blk_q6_K, qh) == offsetof(gg::block_q6_K, qh));
static_assert(offsetof(cm::blk_q6_K, scales) == offsetof(gg::block_q6_K, scales));
static_assert(offsetof(cm::blk_q6_K, d) == offsetof(gg::block_q6_K, d));
static_assert(static_cast<int>(cm::WType::Q4_K) == static_cast<int>(gg::TensorType::Q4_K));
static_assert(static_cast<int>(cm::WType::Q6_K) == static_cast<int>(gg::TensorType::Q6_K));
static_assert(static_cast<int>(cm::WType::Q8_0) == static_cast<int>(gg::TensorType::Q8_0));

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(CudaKernelMath, Fp16ToFp32MatchesReferenceForAll65536Values) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    ASSERT_EQ(bits(cm::fp16_to_fp32(u)), bits(gg::fp16_to_fp32(u)))
        << "half bits 0x" << std::hex << h;
  }
}

// Random row of `type` with finite fp16 scales (random bytes elsewhere).
std::vector<uint8_t> random_row(cm::WType type, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> buf(static_cast<size_t>(cm::row_bytes(type, n)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : buf) b = static_cast<uint8_t>(byte(rng));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  auto half = [&](uint8_t* p) {
    const uint16_t h = gg::fp32_to_fp16(nd(rng));
    std::memcpy(p, &h, 2);
  };
  auto set_halves = [&](size_t block_bytes, std::initializer_list<size_t> offsets) {
    for (size_t b = 0; b < buf.size(); b += block_bytes) {
      for (size_t off : offsets) half(buf.data() + b + off);
    }
  };
  switch (type) {
    case cm::WType::F32: {
      for (int64_t i = 0; i < n; ++i) {
        const float f = nd(rng);
        std::memcpy(buf.data() + 4 * i, &f, 4);
      }
      break;
    }
    case cm::WType::F16:
      for (int64_t i = 0; i < n; ++i) half(buf.data() + 2 * i);
      break;
    case cm::WType::Q4_0:
      set_halves(18, {0});
      break;
    case cm::WType::Q4_1:
      set_halves(20, {0, 2});
      break;
    case cm::WType::Q5_0:
      set_halves(22, {0});
      break;
    case cm::WType::Q8_0:
      set_halves(34, {0});
      break;
    case cm::WType::Q4_K:
      set_halves(144, {0, 2});
      break;
    case cm::WType::Q6_K:
      set_halves(210, {208});
      break;
  }
  return buf;
}

const cm::WType kTypes[] = {cm::WType::F32,  cm::WType::F16,  cm::WType::Q4_0, cm::WType::Q4_1,
                            cm::WType::Q5_0, cm::WType::Q8_0, cm::WType::Q4_K, cm::WType::Q6_K};

TEST(CudaKernelMath, RowBytesMatchGgufTypeTraits) {
  for (cm::WType t : kTypes) {
    const auto& tt = gg::type_traits(static_cast<gg::TensorType>(t));
    EXPECT_EQ(cm::row_bytes(t, 1536), int64_t{1536} / tt.block_size * tt.type_size) << tt.name;
  }
}

TEST(CudaKernelMath, DequantizationIsBitIdenticalToDequantizeRow) {
  std::mt19937 rng(1234);
  const int64_t n = 1024;  // 32 Q4/Q8 blocks, 4 K-quant super-blocks
  for (cm::WType t : kTypes) {
    for (int rep = 0; rep < 20; ++rep) {
      const std::vector<uint8_t> row = random_row(t, n, rng);
      std::vector<float> ref(static_cast<size_t>(n));
      gg::dequantize_row(static_cast<gg::TensorType>(t), row.data(), ref.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(cm::deq_elem(t, row.data(), i)), bits(ref[static_cast<size_t>(i)]))
            << gg::type_name(static_cast<gg::TensorType>(t)) << " element " << i << ": "
            << cm::deq_elem(t, row.data(), i) << " vs " << ref[static_cast<size_t>(i)];
      }
    }
  }
}

// The butterfly equals the documented folding: halves added lane i + lane i+16,
// then i + i+8, ... (lane 0's view), and every lane ends with the same bits.
TEST(CudaKernelMath, WarpButterflyOrderIsTheDocumentedFolding) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int rep = 0; rep < 200; ++rep) {
    float v[32];
    for (float& x : v) x = nd(rng) * std::pow(10.0f, static_cast<float>(rep % 7) - 3.0f);
    float fold[32];
    std::copy(v, v + 32, fold);
    for (int width = 16; width > 0; width /= 2) {
      for (int i = 0; i < width; ++i) fold[i] = fold[i] + fold[i + width];
    }
    EXPECT_EQ(bits(cm::warp_sum_emulated(v)), bits(fold[0]));
    float lanes[32];
    std::copy(v, v + 32, lanes);
    for (int off = 16; off > 0; off /= 2) cm::butterfly_step(lanes, off);
    for (int i = 1; i < 32; ++i) ASSERT_EQ(bits(lanes[i]), bits(lanes[0])) << "lane " << i;
  }
}

// The matvec's warp dot product: chunk-strided lanes with explicit FMAs, then the
// butterfly; checked against an independent restatement of that order and
// against the fp64 dot of the reference-dequantized row.
TEST(CudaKernelMath, WarpDotProductOrderAndAccuracy) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (cm::WType t : kTypes) {
    for (int64_t n : {int64_t{256}, int64_t{576}, int64_t{1536}, int64_t{2048}}) {
      if ((t == cm::WType::Q4_K || t == cm::WType::Q6_K) && n % 256 != 0) continue;
      const std::vector<uint8_t> row = random_row(t, n, rng);
      std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(n));
      for (float& f : x) f = nd(rng);
      gg::dequantize_row(static_cast<gg::TensorType>(t), row.data(), w.data(), n);

      float lanes[32] = {};
      for (int64_t i = 0; i < n; ++i) {
        const auto lane = static_cast<size_t>((i / 32) % 32);
        lanes[lane] = std::fma(w[static_cast<size_t>(i)], x[static_cast<size_t>(i)], lanes[lane]);
      }
      const float emu = cm::row_dot_emulated(t, row.data(), x.data(), n);
      EXPECT_EQ(bits(emu), bits(cm::warp_sum_emulated(lanes))) << "n=" << n;

      double exact = 0.0, mag = 0.0;
      for (size_t i = 0; i < w.size(); ++i) {
        exact += double{w[i]} * double{x[i]};
        mag += std::abs(double{w[i]} * double{x[i]});
      }
      // fp32 accumulation: |error| <= (n/32 + 5) ulp-ish of the magnitude sum.
      const double bound = (static_cast<double>(n) / 32.0 + 6.0) * 0x1p-24 * mag;
      EXPECT_LE(std::abs(double{emu} - exact), bound)
          << gg::type_name(static_cast<gg::TensorType>(t)) << " n=" << n;
    }
  }
}

// reference_forward.cpp rope(), restated.
void reference_rope(float* v, int64_t hd, int32_t pos, double base) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double theta = static_cast<double>(pos) *
                         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    const double c = std::cos(theta), s = std::sin(theta);
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = static_cast<float>(x0 * c - x1 * s);
    v[2 * i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

TEST(CudaKernelMath, RopeFromTableIsBitIdenticalToReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t hd : {int64_t{64}, int64_t{128}}) {
    for (int32_t pos : {0, 1, 2, 17, 100, 511, 4095, 8191}) {
      for (double base : {10000.0, 100000.0, 500000.0}) {
        std::vector<float> a(static_cast<size_t>(hd));
        for (float& f : a) f = nd(rng);
        std::vector<float> b = a;
        reference_rope(a.data(), hd, pos, base);
        for (int64_t i = 0; i < hd / 2; ++i) {
          const double th = cm::rope_theta(pos, i, hd, base, 1.0, 1.0);
          cm::rope_rotate(&b[static_cast<size_t>(2 * i)], &b[static_cast<size_t>(2 * i + 1)],
                          std::cos(th), std::sin(th));
        }
        for (size_t i = 0; i < a.size(); ++i)
          ASSERT_EQ(bits(a[i]), bits(b[i])) << "hd " << hd << " pos " << pos;
      }
    }
  }
}

// Attention of one head through the kernel's merge order (positions into 4 warp
// states, warps into a split state, splits in order) vs the reference's fp64
// softmax-weighted sum.
TEST(CudaKernelMath, OnlineSoftmaxMergeMatchesFp64Softmax) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int hd = 8;
  for (int n_kv : {1, 2, 3, 5, 16, 17, 100, 1000}) {
    for (int n_split : {1, 4, 16}) {
      std::vector<float> s(static_cast<size_t>(n_kv)), v(static_cast<size_t>(n_kv * hd));
      for (float& f : s) f = nd(rng);
      for (float& f : v) f = nd(rng) / 3.0f;
      // fp64 reference (reference_forward.cpp order)
      double mx = -INFINITY, sum = 0.0;
      for (float f : s) mx = std::max(mx, double{f});
      std::vector<double> p(s.size()), ref(static_cast<size_t>(hd), 0.0);
      for (size_t t = 0; t < s.size(); ++t) sum += p[t] = std::exp(double{s[t]} - mx);
      for (int i = 0; i < hd; ++i) {
        for (size_t t = 0; t < s.size(); ++t)
          ref[static_cast<size_t>(i)] += p[t] * double{v[t * hd + static_cast<size_t>(i)]};
      }
      // kernel order
      float fm = -INFINITY, fl = 0.0f, fa[hd] = {};
      const int chunk = (n_kv + n_split - 1) / n_split;
      for (int sp = 0; sp < n_split; ++sp) {
        const int t0 = sp * chunk, t1 = std::min(n_kv, t0 + chunk);
        float wm[4], wl[4], wa[4][hd];
        for (int w = 0; w < 4; ++w) {
          wm[w] = -INFINITY;
          wl[w] = 0.0f;
          std::fill(wa[w], wa[w] + hd, 0.0f);
          for (int t = t0 + w; t < t1; t += 4) {
            cm::softmax_merge(&wm[w], &wl[w], wa[w], s[static_cast<size_t>(t)], 1.0f,
                              &v[static_cast<size_t>(t * hd)], hd);
          }
        }
        for (int w = 1; w < 4; ++w)
          cm::softmax_merge(&wm[0], &wl[0], wa[0], wm[w], wl[w], wa[w], hd);
        cm::softmax_merge(&fm, &fl, fa, wm[0], wl[0], wa[0], hd);
      }
      ASSERT_EQ(fm, static_cast<float>(mx));
      for (int i = 0; i < hd; ++i) {
        const double o = double{fa[i] / fl}, r = ref[static_cast<size_t>(i)] / sum;
        EXPECT_NEAR(o, r, 1e-5 * (1.0 + std::abs(r)))
            << "n_kv " << n_kv << " split " << n_split << " i " << i;
      }
    }
  }
}

TEST(CudaKernelMath, SoftmaxMergeWithEmptyStateIsIdentity) {
  float m = 1.5f, l = 2.25f, a[3] = {0.1f, -0.2f, 0.3f};
  const float a0[3] = {0.1f, -0.2f, 0.3f};
  const float zeros[3] = {};
  cm::softmax_merge(&m, &l, a, -INFINITY, 0.0f, zeros, 3);
  EXPECT_EQ(m, 1.5f);
  EXPECT_EQ(l, 2.25f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bits(a[i]), bits(a0[i]));
  float em = -INFINITY, el = 0.0f, ea[3] = {};
  cm::softmax_merge(&em, &el, ea, -INFINITY, 0.0f, zeros, 3);  // empty + empty: no NaN
  EXPECT_EQ(em, -INFINITY);
  EXPECT_EQ(el, 0.0f);
  for (float f : ea) EXPECT_EQ(f, 0.0f);
  cm::softmax_merge(&em, &el, ea, 1.5f, 2.25f, a0, 3);  // empty + state = state
  EXPECT_EQ(em, 1.5f);
  EXPECT_EQ(el, 2.25f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bits(ea[i]), bits(a0[i]));
}

TEST(CudaKernelMath, ElementwiseMatchReferenceFormulas) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int i = 0; i < 10000; ++i) {
    const float g = nd(rng), u = nd(rng), w = nd(rng);
    const double gd = g;  // reference_forward.cpp SwiGLU
    EXPECT_EQ(bits(cm::silu_mul(g, u)),
              bits(static_cast<float>(gd / (1.0 + std::exp(-gd)) * double{u})));
    EXPECT_EQ(bits(cm::residual_add(g, u)), bits(static_cast<float>(double{g} + double{u})));
    const double inv = 1.0 / std::sqrt(static_cast<double>(i + 1) / 576.0 + 1e-5);
    EXPECT_EQ(bits(cm::rms_scale(g, inv, w)),
              bits(static_cast<float>(double{g} * inv * double{w})));
  }
  EXPECT_EQ(cm::rms_inv(576.0 * 4.0, 576, 0.0), 0.5);
}

TEST(CudaKernelMath, ArgmaxTiesNanAndReductionOrder) {
  const float nan = std::nanf("");
  const std::vector<float> l = {1.0f, 3.0f, nan, 3.0f, -INFINITY, 2.0f, 3.0f};
  auto fold = [](const std::vector<float>& v, const std::vector<int>& order) {
    cm::ArgMax best{0.0f, -1};
    for (int i : order)
      best = cm::argmax_merge(best, cm::argmax_leaf(v[static_cast<size_t>(i)], i));
    return best.id;
  };
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  EXPECT_EQ(fold(l, order), 1);  // ties -> lowest id, NaN skipped
  std::mt19937 rng(1);
  for (int rep = 0; rep < 100; ++rep) {
    std::shuffle(order.begin(), order.end(), rng);
    EXPECT_EQ(fold(l, order), 1);  // the merge is order-independent (tree reduction on the device)
  }
  EXPECT_EQ(fold({nan, nan}, {0, 1}), -1);
  EXPECT_EQ(fold({-INFINITY, nan, -INFINITY}, {0, 1, 2}), 0);
}

TEST(CudaKernelMath, Fp32ToFp16MatchesReference) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any;
  const float edge[] = {0.0f,      -0.0f,          65504.0f,   65519.99f, 65520.0f,
                        1e-8f,     2.9802322e-08f, 6.1e-05f,   6.2e-05f,  INFINITY,
                        -INFINITY, std::nanf(""),  1.0f / 3.0f};
  for (float f : edge) {
    EXPECT_EQ(cm::fp32_to_fp16(f), gg::fp32_to_fp16(f)) << f;
    EXPECT_EQ(bits(cm::round_fp16(f)), bits(gg::fp16_to_fp32(gg::fp32_to_fp16(f)))) << f;
  }
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(any(rng));
    ASSERT_EQ(cm::fp32_to_fp16(f), gg::fp32_to_fp16(f)) << std::bit_cast<uint32_t>(f);
  }
}

// Partial rotary, NeoX and interleaved pairs, linear scaling and frequency
// factors: the table angle + rope_pair + rope_rotate equal ops::rope_* bit for bit.
TEST(CudaKernelMath, RopeVariantsAreBitIdenticalToReferenceOps) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> ud(1.0f, 8.0f);
  for (const bool neox : {false, true}) {
    for (const int64_t hd : {int64_t{16}, int64_t{64}, int64_t{256}}) {
      for (const int64_t n_rot : {hd, hd / 2}) {
        std::vector<float> ff(static_cast<size_t>(n_rot / 2));
        for (float& f : ff) f = ud(rng);
        for (const bool factors : {false, true}) {
          for (const double scale : {1.0, 8.0}) {
            for (const int32_t pos : {0, 1, 7, 255, 4095}) {
              std::vector<float> a(static_cast<size_t>(hd));
              for (float& f : a) f = nd(rng);
              std::vector<float> b = a;
              const float* fp = factors ? ff.data() : nullptr;
              (neox ? touchstone::ops::rope_neox : touchstone::ops::rope_interleaved)(
                  a.data(), n_rot, pos, 1e6, scale, fp);
              for (int i = 0; i < int(n_rot / 2); ++i) {
                const double th = cm::rope_theta(pos, i, n_rot, 1e6, scale,
                                                 factors ? double{ff[size_t(i)]} : 1.0);
                int x0 = 0, x1 = 0;
                cm::rope_pair(i, int(n_rot), neox, &x0, &x1);
                cm::rope_rotate(&b[size_t(x0)], &b[size_t(x1)], std::cos(th), std::sin(th));
              }
              for (size_t i = 0; i < a.size(); ++i)
                ASSERT_EQ(bits(a[i]), bits(b[i]))
                    << "neox " << neox << " hd " << hd << " n_rot " << n_rot << " pos " << pos;
            }
          }
        }
      }
    }
  }
}

TEST(CudaKernelMath, GeluSoftcapAndEmbeddingScaleMatchReferenceOps) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 6.0f);
  for (int i = 0; i < 100000; ++i) {
    const float g = nd(rng), u = nd(rng);
    // reference_forward.cpp feed_forward: float(gelu_tanh(g) * up)
    EXPECT_EQ(bits(cm::gelu_mul(g, u)),
              bits(static_cast<float>(touchstone::ops::gelu_tanh(double{g}) * double{u})));
    EXPECT_EQ(bits(cm::softcap(g * 10.0f, 30.0)),
              bits(static_cast<float>(touchstone::ops::softcap(double{g * 10.0f}, 30.0))));
    const double es = std::sqrt(double{640.0f});
    EXPECT_EQ(bits(cm::embd_scaled(g, es)), bits(static_cast<float>(double{g} * es)));
  }
}

// The KV range of one query (reference_forward.cpp attention(): causal, sliding
// window, and the faults kv_position_off_by_one, rewind_noop and causal_mask).
TEST(CudaKernelMath, AttentionRangeFollowsTheReference) {
  auto range = [](int pos, int chunk_end, int floor, int window, bool drop, bool whole) {
    const cm::KvRange r = cm::attention_range(pos, chunk_end, floor, window, drop, whole);
    return std::pair<int, int>{r.t0, r.t1};
  };
  using P = std::pair<int, int>;
  EXPECT_EQ(range(0, 1, 0, 0, false, false), P(0, 1));
  EXPECT_EQ(range(9, 12, 0, 0, false, false), P(0, 10));   // causal: 0..pos
  EXPECT_EQ(range(9, 12, 0, 4, false, false), P(6, 10));   // window 4: the last 4
  EXPECT_EQ(range(2, 12, 0, 8, false, false), P(0, 3));    // window longer than the past
  EXPECT_EQ(range(9, 12, 0, 0, true, false), P(0, 9));     // newest entry dropped
  EXPECT_EQ(range(0, 12, 0, 0, true, false), P(0, 1));     // ... but never at position 0
  EXPECT_EQ(range(3, 12, 20, 0, false, false), P(0, 20));  // stale entries up to the floor
  EXPECT_EQ(range(9, 12, 0, 0, false, true), P(0, 12));    // the chunk's future tokens
  EXPECT_EQ(range(11, 12, 0, 0, false, true), P(0, 12));
}

// softmax_no_max: exp(s) without the max, in fp32; equal to the fp64 softmax
// for small scores, inf / NaN once a score passes ~88.7 (the fault's point).
TEST(CudaKernelMath, SoftmaxWithoutMaxMatchesAndOverflows) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int n = 8, T = 50;
  float m = -INFINITY, l = 0.0f, acc[n] = {}, scratch[n];
  double ref_l = 0.0, ref_a[n] = {};
  for (int t = 0; t < T; ++t) {
    const float s = nd(rng);
    float v[n];
    for (float& x : v) x = nd(rng);
    cm::softmax_add_no_max(&m, &l, acc, s, v, scratch, n);
    const double e = std::exp(double{s});
    ref_l += e;
    for (int i = 0; i < n; ++i) ref_a[i] += e * double{v[i]};
  }
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(acc[i] / l, ref_a[i] / ref_l, 1e-5 * (1 + std::abs(ref_a[i] / ref_l)));
  const float big[n] = {1, 1, 1, 1, 1, 1, 1, 1};
  cm::softmax_add_no_max(&m, &l, acc, 100.0f, big, scratch, n);
  EXPECT_TRUE(std::isinf(l));
  EXPECT_FALSE(std::isfinite(acc[0] / l));
}

// The quantized-only faults: a corrupted block decodes as the buggy kernel
// would read the original (nibbles swapped: element j <-> its partner in the
// same byte; scale / min swapped: d and m exchanged).
TEST(CudaKernelMath, QuantFaultCorruptionIsTheDocumentedBug) {
  std::mt19937 rng(19);
  const int64_t n = 256;
  for (cm::WType t : {cm::WType::Q4_0, cm::WType::Q4_1, cm::WType::Q4_K}) {
    cm::Q4Layout lay{};
    ASSERT_TRUE(cm::q4_layout(t, &lay));
    std::vector<uint8_t> row = random_row(t, n, rng);
    if (t == cm::WType::Q4_K) {
      // Every sub-block scale and min 5 (get_scale_min_k4), so that the two
      // nibbles of a byte (sub-blocks 2c and 2c+1) decode with the same scale.
      const uint8_t sc[12] = {5, 5, 5, 5, 5, 5, 5, 5, 0x55, 0x55, 0x55, 0x55};
      for (size_t b = 0; b < row.size(); b += size_t(lay.block_bytes))
        std::memcpy(row.data() + b + 4, sc, sizeof sc);
    }
    std::vector<uint8_t> nib = row;
    for (size_t b = 0; b < nib.size(); b += size_t(lay.block_bytes))
      cm::corrupt_q4_block(nib.data() + b, lay, false);
    const int span = t == cm::WType::Q4_K ? 32 : 16;  // distance of the two nibbles of a byte
    for (int64_t i = 0; i < n; ++i) {
      const int64_t in_group = i % (2 * span), partner = in_group < span ? i + span : i - span;
      ASSERT_EQ(bits(cm::deq_elem(t, nib.data(), i)), bits(cm::deq_elem(t, row.data(), partner)))
          << gg::type_name(static_cast<gg::TensorType>(t)) << " element " << i;
    }
    if (!lay.has_min) {
      EXPECT_EQ(t, cm::WType::Q4_0);
      continue;
    }
    std::vector<uint8_t> sw = row;
    for (size_t b = 0; b < sw.size(); b += size_t(lay.block_bytes))
      cm::corrupt_q4_block(sw.data() + b, lay, true);
    for (size_t b = 0; b < sw.size(); b += size_t(lay.block_bytes)) {
      EXPECT_EQ(std::memcmp(sw.data() + b, row.data() + b + 2, 2), 0);
      EXPECT_EQ(std::memcmp(sw.data() + b + 2, row.data() + b, 2), 0);
      EXPECT_EQ(std::memcmp(sw.data() + b + 4, row.data() + b + 4, size_t(lay.block_bytes) - 4), 0);
    }
    if (t == cm::WType::Q4_1) {
      const auto& b0 = *reinterpret_cast<const cm::blk_q4_1*>(row.data());
      const int q = b0.qs[0] & 0x0F;
      EXPECT_EQ(
          bits(cm::deq_elem(t, sw.data(), 0)),
          bits(cm::add_rn(cm::mul_rn(float(q), cm::fp16_to_fp32(b0.m)), cm::fp16_to_fp32(b0.d))));
    }
  }
  cm::Q4Layout lay{};
  EXPECT_FALSE(cm::q4_layout(cm::WType::Q8_0, &lay));
  EXPECT_FALSE(cm::q4_layout(cm::WType::Q6_K, &lay));
}

}  // namespace
