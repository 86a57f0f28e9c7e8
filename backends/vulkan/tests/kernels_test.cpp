// kernels_test.cpp - every shader against a scalar CPU implementation on small
// random inputs, for the subgroup and the shared-memory variants. SKIPs when
// no Vulkan device exists. Tolerance: |gpu - cpu| <= 1e-4 * max(1, max|cpu|)
// (fp32 accumulation on the device vs fp64 on the CPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"
#include "vk_blocks.h"
#include "vk_buffer.h"
#include "vk_context.h"
#include "vk_kernels.h"

namespace touchstone::vk {
namespace {

using gguf::TensorType;

// Every type the shaders read (shader_reads).
constexpr TensorType kShaderTypes[] = {TensorType::F32,  TensorType::Q4_0, TensorType::Q4_1,
                                       TensorType::Q8_0, TensorType::Q5_0, TensorType::Q4_K,
                                       TensorType::Q5_K, TensorType::Q6_K};

// Param: 0 = matmul split across a workgroup + shared-memory sums, 1 = split +
// subgroup sums, 2 = the CPU strategy (matmul_rows.comp, attention_rows.comp;
// the lavapipe default).
class KernelTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    setenv("TOUCHSTONE_VULKAN_SUBGROUP", GetParam() == 0 ? "0" : "1", 1);
    setenv("TOUCHSTONE_VULKAN_MATMUL", GetParam() == 2 ? "rows" : "split", 1);
    try {
      ctx_ = Context::create();
    } catch (const abi::StatusError& e) {
      if (e.status() == TS_ERR_DEVICE) GTEST_SKIP() << "no Vulkan device: " << e.what();
      // matmul_rows.comp needs 8-wide subgroups, subgroupShuffle and shaderInt64.
      if (e.status() == TS_ERR_UNSUPPORTED && GetParam() == 2)
        GTEST_SKIP() << "device cannot run the rows strategy: " << e.what();
      throw;
    }
    if (GetParam() == 1 && !ctx_->use_subgroup())
      GTEST_SKIP() << "device has no subgroup arithmetic";
    kernels_ = std::make_unique<Kernels>(*ctx_);
    sets_ = std::make_unique<DescriptorCache>(*ctx_);
  }
  void TearDown() override {
    sets_.reset();
    kernels_.reset();
    if (ctx_) {
      EXPECT_NO_THROW(ctx_->check_validation());
    }
    unsetenv("TOUCHSTONE_VULKAN_SUBGROUP");
    unsetenv("TOUCHSTONE_VULKAN_MATMUL");
  }
  Buffer host(const void* data, size_t bytes) {
    Buffer b(*ctx_, bytes, Buffer::Kind::Host);
    if (data) {
      b.upload(data, bytes);
    } else {
      b.zero();
    }
    return b;
  }
  template <typename T>
  Buffer host(const std::vector<T>& v) {
    return host(v.data(), v.size() * sizeof(T));
  }
  template <typename F>
  void run(F&& f) {
    ctx_->run([&](VkCommandBuffer cb) {
      Recorder r(cb, *sets_);
      f(r);
      r.host_barrier();
    });
  }
  static std::vector<float> read(const Buffer& b) {
    std::vector<float> v(b.size() / sizeof(float));
    std::memcpy(v.data(), b.mapped(), b.size());
    return v;
  }
  std::vector<float> randn(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  // Random GGUF blocks of `type` for n_out rows of n_in elements.
  std::vector<uint8_t> random_weights(TensorType type, size_t n_in, size_t n_out) {
    if (type == TensorType::F32) {
      const auto f = randn(n_in * n_out, 0.1f);
      std::vector<uint8_t> b(f.size() * 4);
      std::memcpy(b.data(), f.data(), b.size());
      return b;
    }
    const auto& tr = gguf::type_traits(type);
    std::vector<uint8_t> b(n_in * n_out / tr.block_size * tr.type_size);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.002f, 0.03f), mn(-0.1f, 0.1f);
    for (uint8_t& x : b) x = uint8_t(byte(rng_));
    // Finite fp16 scales: d first (Q6_K: last), then Q4_1's m or a K-quant's dmin.
    const bool k_min = type == TensorType::Q4_K || type == TensorType::Q5_K;
    const size_t d_at = type == TensorType::Q6_K ? 208 : 0;
    for (size_t blk = 0; blk < b.size() / tr.type_size; ++blk) {
      uint8_t* p = b.data() + blk * tr.type_size;
      const uint16_t d = gguf::fp32_to_fp16(scale(rng_));
      std::memcpy(p + d_at, &d, 2);
      if (type == TensorType::Q4_1 || k_min) {
        const uint16_t m = gguf::fp32_to_fp16(k_min ? scale(rng_) : mn(rng_));
        std::memcpy(p + 2, &m, 2);
      }
    }
    return b;
  }
  // GGUF blocks -> the buffer the shaders read (split layout for quantized types).
  Buffer weights(TensorType type, const std::vector<uint8_t>& w, size_t n_in, size_t n_rows) {
    if (type == TensorType::F32) return host(w);
    return host(to_device_blocks(type, w.data(), n_in, n_rows));
  }
  static std::vector<float> dequant(TensorType type, const std::vector<uint8_t>& w, size_t n) {
    std::vector<float> out(n);
    gguf::dequantize_row(type, w.data(), out.data(), int64_t(n));
    return out;
  }
  static void expect_close(const std::vector<float>& gpu, const std::vector<double>& cpu,
                           const char* what) {
    ASSERT_GE(gpu.size(), cpu.size());
    double scale = 1.0;
    for (double c : cpu) scale = std::max(scale, std::abs(c));
    double worst = 0.0;
    for (size_t i = 0; i < cpu.size(); ++i)
      worst = std::max(worst, std::abs(double(gpu[i]) - cpu[i]));
    EXPECT_LE(worst, 1e-4 * scale)
        << what << ": worst abs diff " << worst << " (scale " << scale << ")";
  }

  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<DescriptorCache> sets_;
  std::mt19937 rng_{1234};
};

TEST_P(KernelTest, MatmulEveryTypeMatchesCpu) {
  for (TensorType type : kShaderTypes) {
    const bool k = gguf::type_traits(type).block_size == 256;  // K-quants: 256-element blocks
    for (uint32_t n_in : {k ? 256u : 96u, k ? 512u : 320u}) {
      for (uint32_t n_tok : {1u, 3u, 8u, 13u}) {
        const uint32_t n_out = 37, x_off = 8, y_off = 3, x_stride = n_in + 4, y_stride = n_out + 2;
        const auto wb = random_weights(type, n_in, n_out);
        const auto wf = dequant(type, wb, size_t(n_in) * n_out);
        const auto x = randn(x_off + size_t(n_tok) * x_stride);
        const auto y0 = randn(y_off + size_t(n_tok) * y_stride);
        for (uint32_t acc : {0u, 1u}) {
          Buffer W = weights(type, wb, n_in, n_out), X = host(x), Y = host(y0);
          run([&](Recorder& r) {
            record_matmul(r, *kernels_, type, W, X, Y,
                          MatmulPush{n_in, n_out, n_tok, x_off, x_stride, y_off, y_stride, acc});
          });
          std::vector<double> want(y0.begin(), y0.end());
          for (uint32_t t = 0; t < n_tok; ++t) {
            for (uint32_t o = 0; o < n_out; ++o) {
              double s = 0.0;
              for (uint32_t i = 0; i < n_in; ++i)
                s += double(wf[size_t(o) * n_in + i]) * x[x_off + t * x_stride + i];
              const size_t yi = y_off + size_t(t) * y_stride + o;
              want[yi] = acc ? double(y0[yi]) + s : s;
            }
          }
          expect_close(read(Y), want,
                       ("matmul " + std::string(shader_type_suffix(type)) +
                        " n_in=" + std::to_string(n_in) + " n_tok=" + std::to_string(n_tok))
                           .c_str());
        }
      }
    }
  }
}

TEST_P(KernelTest, GetRowsEveryTypeMatchesCpu) {
  for (TensorType type : kShaderTypes) {
    const uint32_t n = gguf::type_traits(type).block_size == 256 ? 512 : 320, rows = 11,
                   out_off = 7;
    const auto wb = random_weights(type, n, rows);
    const auto wf = dequant(type, wb, size_t(n) * rows);
    const std::vector<int32_t> tokens{3, 0, 10, 3, 7};
    Buffer W = weights(type, wb, n, rows), Tk = host(tokens),
           O = host(nullptr, (out_off + tokens.size() * n) * 4);
    run([&](Recorder& r) {
      r.dispatch(kernels_->get_rows(type), {&W, &Tk, &O},
                 GetRowsPush{n, uint32_t(tokens.size()), out_off, rows, 1.0f, 0},
                 uint32_t(tokens.size()));
    });
    const auto got = read(O);
    for (size_t t = 0; t < tokens.size(); ++t) {
      for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[out_off + t * n + i], wf[size_t(tokens[t]) * n + i])
            << shader_type_suffix(type);
      }
    }
  }
}

TEST_P(KernelTest, RmsNormMatchesCpu) {
  const uint32_t n = 576, n_tok = 3, x_off = 10, x_stride = 600, out_stride = 580;
  const float eps = 1e-5f;
  const auto x = randn(x_off + n_tok * x_stride, 2.0f);
  const auto w = randn(n);
  Buffer X = host(x), Wt = host(w), O = host(nullptr, n_tok * out_stride * 4);
  run([&](Recorder& r) {
    r.dispatch(kernels_->rms_norm(), {&X, &Wt, &O},
               RmsNormPush{n, n_tok, x_off, x_stride, 0, out_stride, eps}, n_tok);
  });
  std::vector<double> want(n_tok * out_stride, 0.0);
  for (uint32_t t = 0; t < n_tok; ++t) {
    double ss = 0.0;
    for (uint32_t i = 0; i < n; ++i)
      ss += double(x[x_off + t * x_stride + i]) * x[x_off + t * x_stride + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; ++i)
      want[t * out_stride + i] = x[x_off + t * x_stride + i] * inv * w[i];
  }
  expect_close(read(O), want, "rms_norm");
}

// SwiGLU, GeGLU (tanh GELU) and gpt-oss's clamped SwiGLU (touchstone/model/scalar_ops.h),
// gates up to |x| ~ 15 (past the clamp's limit 7 both ways; up values scaled past it too).
TEST_P(KernelTest, GluMatchesCpu) {
  const uint32_t n = 1000;
  for (uint32_t act : {0u, 1u, 2u}) {
    const auto g = randn(n, 5.0f), u = randn(n, act == 2u ? 5.0f : 1.0f);
    Buffer G = host(g), U = host(u);
    run([&](Recorder& r) {
      r.dispatch(kernels_->glu(), {&G, &U},
                 GluPush{n, act, float(touchstone::ops::kSwigluOaiAlpha),
                         float(touchstone::ops::kSwigluOaiLimit)},
                 (n + kWorkgroup - 1) / kWorkgroup);
    });
    std::vector<double> want(n);
    for (uint32_t i = 0; i < n; ++i) {
      want[i] = act == 2u
                    ? touchstone::ops::swiglu_oai(g[i], u[i])
                    : (act ? touchstone::ops::gelu_tanh(g[i]) : touchstone::ops::silu(g[i])) * u[i];
    }
    expect_close(read(G), want, act == 2u ? "swiglu_oai" : act ? "geglu" : "swiglu");
  }
}

// RoPE + KV store, then GQA attention over positions 0..pos0+t.
TEST_P(KernelTest, RopeStoreAndAttentionMatchCpu) {
  // hd = 64: attention_rows.comp in the row_per_invocation variant.
  const uint32_t n_head = 4, n_head_kv = 2, hd = 64, max_ctx = 16, pos0 = 5, n_tok = 3;
  const uint32_t q_dim = n_head * hd, kv_dim = n_head_kv * hd;
  const double base = 10000.0;
  auto q = randn(n_tok * q_dim), k = randn(n_tok * kv_dim), v = randn(n_tok * kv_dim);
  auto kc = randn(max_ctx * kv_dim),
       vc = randn(max_ctx * kv_dim);  // positions < pos0: earlier tokens
  std::vector<float> rope(max_ctx * hd);
  for (uint32_t p = 0; p < max_ctx; ++p) {
    for (uint32_t i = 0; i < hd / 2; ++i) {
      const double th = p * std::pow(base, -2.0 * i / hd);
      rope[(p * hd / 2 + i) * 2] = float(std::cos(th));
      rope[(p * hd / 2 + i) * 2 + 1] = float(std::sin(th));
    }
  }
  Buffer Q = host(q), K = host(k), V = host(v), KC = host(kc), VC = host(vc), R = host(rope);
  Buffer S = host(nullptr, n_tok * n_head * max_ctx * 4), O = host(nullptr, n_tok * q_dim * 4);
  const float scale = float(1.0 / std::sqrt(double(hd)));
  run([&](Recorder& r) {
    r.dispatch(kernels_->rope_store(), {&Q, &K, &V, &KC, &VC, &R},
               RopeStorePush{n_tok, pos0, n_head, n_head_kv, hd, 0, hd, 0}, n_tok);
    r.barrier();
    r.dispatch(
        kernels_->attention(hd), {&Q, &KC, &VC, &S, &O, &Q},  // (no sinks: binding 5 unread)
        AttentionPush{n_tok, pos0, n_head, n_head_kv, hd, max_ctx, 0, scale, pos0 + n_tok, 0},
        n_head, n_tok);
  });
  // CPU: rope (fp64, as reference_forward.cpp), store, attention.
  auto rot = [&](std::vector<double>& x, size_t off, uint32_t pos) {
    for (uint32_t i = 0; i < hd / 2; ++i) {
      const double th = pos * std::pow(base, -2.0 * i / hd), c = std::cos(th), s = std::sin(th);
      const double x0 = x[off + 2 * i], x1 = x[off + 2 * i + 1];
      x[off + 2 * i] = x0 * c - x1 * s;
      x[off + 2 * i + 1] = x0 * s + x1 * c;
    }
  };
  std::vector<double> qd(q.begin(), q.end()), kcd(kc.begin(), kc.end()), vcd(vc.begin(), vc.end());
  for (uint32_t t = 0; t < n_tok; ++t) {
    for (uint32_t h = 0; h < n_head; ++h) rot(qd, t * q_dim + h * hd, pos0 + t);
    for (uint32_t i = 0; i < kv_dim; ++i) {
      kcd[(pos0 + t) * kv_dim + i] = k[t * kv_dim + i];
      vcd[(pos0 + t) * kv_dim + i] = v[t * kv_dim + i];
    }
    for (uint32_t h = 0; h < n_head_kv; ++h) rot(kcd, (pos0 + t) * kv_dim + h * hd, pos0 + t);
  }
  expect_close(read(Q), qd, "rope q");
  std::vector<double> kcw(kcd.begin(), kcd.begin() + (pos0 + n_tok) * kv_dim);
  std::vector<float> kc_got = read(KC), vc_got = read(VC);
  expect_close(
      std::vector<float>(kc_got.begin() + pos0 * kv_dim, kc_got.begin() + (pos0 + n_tok) * kv_dim),
      std::vector<double>(kcd.begin() + pos0 * kv_dim, kcd.begin() + (pos0 + n_tok) * kv_dim),
      "k cache");
  expect_close(
      std::vector<float>(vc_got.begin() + pos0 * kv_dim, vc_got.begin() + (pos0 + n_tok) * kv_dim),
      std::vector<double>(vcd.begin() + pos0 * kv_dim, vcd.begin() + (pos0 + n_tok) * kv_dim),
      "v cache");
  std::vector<double> want(n_tok * q_dim);
  for (uint32_t t = 0; t < n_tok; ++t) {
    const uint32_t n_kv = pos0 + t + 1;
    for (uint32_t h = 0; h < n_head; ++h) {
      const uint32_t kvo = (h / (n_head / n_head_kv)) * hd;
      std::vector<double> s(n_kv);
      double mx = -INFINITY, sum = 0.0;
      for (uint32_t j = 0; j < n_kv; ++j) {
        double dot = 0.0;
        for (uint32_t i = 0; i < hd; ++i)
          dot += qd[t * q_dim + h * hd + i] * kcd[j * kv_dim + kvo + i];
        s[j] = dot / std::sqrt(double(hd));
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (uint32_t i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (uint32_t j = 0; j < n_kv; ++j) acc += s[j] * vcd[j * kv_dim + kvo + i];
        want[t * q_dim + h * hd + i] = acc / sum;
      }
    }
  }
  expect_close(read(O), want, "attention");
}

// NeoX RoPE over the first n_rot of hd dims (partial rotary, linear scaling,
// frequency factors folded into the table as the backend does), the KV store,
// then attention with a model scale and a sliding window of W positions.
TEST_P(KernelTest, NeoxPartialRopeAndSlidingWindowMatchCpu) {
  const uint32_t n_head = 4, n_head_kv = 2, hd = 64, n_rot = 32, max_ctx = 16, pos0 = 6, n_tok = 3,
                 window = 4;
  const uint32_t q_dim = n_head * hd, kv_dim = n_head_kv * hd, half = n_rot / 2;
  const double base = 1e6, lin = 2.0, scale = 0.3;
  std::vector<float> ff(half);
  for (uint32_t i = 0; i < half; ++i) ff[i] = 1.0f + float(i % 4);
  auto q = randn(n_tok * q_dim), k = randn(n_tok * kv_dim), v = randn(n_tok * kv_dim);
  auto kc = randn(max_ctx * kv_dim), vc = randn(max_ctx * kv_dim);
  std::vector<float> rope(max_ctx * half * 2);
  for (uint32_t p = 0; p < max_ctx; ++p) {
    for (uint32_t i = 0; i < half; ++i) {
      const double th = touchstone::ops::rope_theta(int32_t(p), i, n_rot, base, lin, ff[i]);
      rope[(p * half + i) * 2] = float(std::cos(th));
      rope[(p * half + i) * 2 + 1] = float(std::sin(th));
    }
  }
  Buffer Q = host(q), K = host(k), V = host(v), KC = host(kc), VC = host(vc), R = host(rope);
  Buffer S = host(nullptr, n_tok * n_head * max_ctx * 4), O = host(nullptr, n_tok * q_dim * 4);
  run([&](Recorder& r) {
    r.dispatch(kernels_->rope_store(), {&Q, &K, &V, &KC, &VC, &R},
               RopeStorePush{n_tok, pos0, n_head, n_head_kv, hd, 0, n_rot, 1}, n_tok);
    r.barrier();
    r.dispatch(kernels_->attention(hd), {&Q, &KC, &VC, &S, &O, &Q},
               AttentionPush{n_tok, pos0, n_head, n_head_kv, hd, max_ctx, 0, float(scale),
                             pos0 + n_tok, window},
               n_head, n_tok);
  });
  // CPU: touchstone/model/scalar_ops.h's rope_neox, then the windowed attention in fp64.
  std::vector<float> qr = q, kr = k;
  for (uint32_t t = 0; t < n_tok; ++t) {
    for (uint32_t h = 0; h < n_head; ++h)
      touchstone::ops::rope_neox(qr.data() + t * q_dim + h * hd, n_rot, int32_t(pos0 + t), base,
                                 lin, ff.data());
    for (uint32_t h = 0; h < n_head_kv; ++h)
      touchstone::ops::rope_neox(kr.data() + t * kv_dim + h * hd, n_rot, int32_t(pos0 + t), base,
                                 lin, ff.data());
  }
  std::vector<double> kcd(kc.begin(), kc.end()), vcd(vc.begin(), vc.end());
  for (uint32_t i = 0; i < n_tok * kv_dim; ++i) {
    kcd[pos0 * kv_dim + i] = kr[i];
    vcd[pos0 * kv_dim + i] = v[i];
  }
  expect_close(read(Q), std::vector<double>(qr.begin(), qr.end()), "neox rope q");
  const auto kc_got = read(KC);
  expect_close(std::vector<float>(kc_got.begin() + pos0 * kv_dim, kc_got.end()),
               std::vector<double>(kcd.begin() + pos0 * kv_dim, kcd.begin() + max_ctx * kv_dim),
               "k cache (rotated and pass-through dims)");
  std::vector<double> want(n_tok * q_dim);
  for (uint32_t t = 0; t < n_tok; ++t) {
    const uint32_t pos = pos0 + t, j0 = pos + 1 - window;  // positions (pos - W, pos]
    for (uint32_t h = 0; h < n_head; ++h) {
      const uint32_t kvo = (h / (n_head / n_head_kv)) * hd;
      std::vector<double> s;
      double mx = -INFINITY, sum = 0.0;
      for (uint32_t j = j0; j <= pos; ++j) {
        double dot = 0.0;
        for (uint32_t i = 0; i < hd; ++i)
          dot += double(qr[t * q_dim + h * hd + i]) * kcd[j * kv_dim + kvo + i];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (uint32_t i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (uint32_t j = j0; j <= pos; ++j) acc += s[j - j0] * vcd[j * kv_dim + kvo + i];
        want[t * q_dim + h * hd + i] = acc / sum;
      }
    }
  }
  expect_close(read(O), want, "windowed attention");
}

// The elementwise kernels of the model families: Q/K/V bias, residual add,
// logit soft-capping (touchstone/model/scalar_ops.h: softcap), tap row copy.
TEST_P(KernelTest, ElementwiseKernelsMatchCpu) {
  const uint32_t n = 100, n_tok = 3, vocab = 70, rows = 2, src_off = 40, dst_off = 9;
  const float cap = 30.0f;
  const auto y = randn(n * n_tok), b = randn(n), x = randn(n * n_tok),
             l = randn(rows * vocab, 60.0f);
  Buffer Y = host(y), Bb = host(b), X = host(x), Yadd = host(y), L = host(l),
         D = host(nullptr, (dst_off + n) * 4);
  run([&](Recorder& r) {
    r.dispatch(kernels_->bias_add(), {&Y, &Bb}, BiasAddPush{n, n_tok}, (n * n_tok + 63) / 64);
    r.dispatch(kernels_->add(), {&X, &Yadd}, AddPush{n * n_tok}, (n * n_tok + 63) / 64);
    r.dispatch(kernels_->softcap(), {&L}, SoftcapPush{vocab, 0, cap}, (vocab + 63) / 64, rows);
    r.dispatch(kernels_->copy(), {&Yadd, &D}, CopyPush{n, src_off, dst_off}, (n + 63) / 64);
  });
  std::vector<double> wy(n * n_tok), wx(n * n_tok), wl(rows * vocab), wd(dst_off + n, 0.0);
  for (uint32_t i = 0; i < n * n_tok; ++i) {
    wy[i] = double(y[i]) + b[i % n];
    wx[i] = double(x[i]) + y[i];
  }
  for (uint32_t i = 0; i < rows * vocab; ++i) wl[i] = touchstone::ops::softcap(l[i], cap);
  for (uint32_t i = 0; i < n; ++i) wd[dst_off + i] = y[src_off + i];
  expect_close(read(Y), wy, "bias_add");
  expect_close(read(X), wx, "add");
  expect_close(read(L), wl, "softcap");
  expect_close(read(D), wd, "copy");
}

// A mixture-of-experts expert: a matmul bound to a byte range of a slab holding
// two matrices (the second at an aligned offset, as src/vk_experts.cpp packs them)
// gives the bits of the same matrix in a buffer of its own, for every type.
TEST_P(KernelTest, MatmulOnASlabRangeEqualsItsOwnBuffer) {
  const uint32_t n_in = 256, n_out = 40, n_tok = 3;
  const uint64_t align = std::max<uint64_t>(4, ctx_->info().min_storage_buffer_offset_alignment);
  for (TensorType type : kShaderTypes) {
    const auto w0 = random_weights(type, n_in, n_out), w1 = random_weights(type, n_in, n_out);
    auto dev = [&](const std::vector<uint8_t>& w) {
      return type == TensorType::F32 ? w : to_device_blocks(type, w.data(), n_in, n_out);
    };
    const std::vector<uint8_t> d0 = dev(w0), d1 = dev(w1);
    const uint64_t off = (d0.size() + align - 1) / align * align;
    std::vector<uint8_t> slab(off + d1.size(), 0);
    std::memcpy(slab.data(), d0.data(), d0.size());
    std::memcpy(slab.data() + off, d1.data(), d1.size());
    const auto x = randn(n_tok * n_in);
    Buffer S = host(slab), Own = host(d1), X = host(x);
    Buffer Y0 = host(nullptr, n_tok * n_out * 4), Y1 = host(nullptr, n_tok * n_out * 4);
    const MatmulPush p{n_in, n_out, n_tok, 0, n_in, 0, n_out, 0};
    run([&](Recorder& r) {
      record_matmul(r, *kernels_, type, BufferRange(&S, off, d1.size()), X, Y0, p);
      record_matmul(r, *kernels_, type, Own, X, Y1, p);
    });
    EXPECT_EQ(read(Y0), read(Y1)) << shader_type_suffix(type);
  }
}

// moe_gather.comp copies rows into the grouped order; moe_sum.comp sums each
// token's k expert rows times their weights in slot order, in fp32, every product
// and sum rounded (no contraction), then, with a shared expert (qwen2moe), adds
// sigma[t] * sh[t][c] the same way.
TEST_P(KernelTest, MoeGatherAndSumMatchCpu) {
  const uint32_t n = 64, n_tok = 5, k = 3, S = 8 * k;  // route sections of S (8 rows)
  const auto src = randn(n_tok * n), eo = randn(n_tok * k * n), w = randn(n_tok * k, 0.3f);
  const auto sh = randn(n_tok * n), sig = randn(n_tok, 0.5f);
  std::vector<uint32_t> route(3 * S + 8, 0);
  for (uint32_t g = 0; g < n_tok * k; ++g) route[g] = (g * 7 + 3) % n_tok;  // token of row g
  for (uint32_t s = 0; s < n_tok * k; ++s) {
    route[S + s] = (s * 5 + 1) % (n_tok * k);  // a permutation: the slot's grouped row
    std::memcpy(&route[2 * S + s], &w[s], 4);
  }
  for (uint32_t t = 0; t < n_tok; ++t) std::memcpy(&route[3 * S + t], &sig[t], 4);
  Buffer Src = host(src), E = host(eo), R = host(route), Sh = host(sh);
  Buffer G = host(nullptr, n_tok * k * n * 4), O = host(nullptr, n_tok * n * 4);
  Buffer O2 = host(nullptr, n_tok * n * 4);
  run([&](Recorder& r) {
    r.dispatch(kernels_->moe_gather(), {&Src, &R, &G}, MoeGatherPush{n, n_tok * k, 0},
               (n + kWorkgroup - 1) / kWorkgroup, n_tok * k);
    r.dispatch(kernels_->moe_sum(), {&E, &R, &O, &E}, MoeSumPush{n, n_tok, k, S, 2 * S},
               (n + kWorkgroup - 1) / kWorkgroup, n_tok);
    r.dispatch(kernels_->moe_sum(), {&E, &R, &O2, &Sh}, MoeSumPush{n, n_tok, k, S, 2 * S, 1, 3 * S},
               (n + kWorkgroup - 1) / kWorkgroup, n_tok);
  });
  const std::vector<float> g = read(G), o = read(O), o2 = read(O2);
  for (uint32_t row = 0; row < n_tok * k; ++row) {
    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(g[row * n + i], src[route[row] * n + i]) << row;
  }
  for (uint32_t t = 0; t < n_tok; ++t) {
    for (uint32_t c = 0; c < n; ++c) {
      float acc = 0.0f;
      for (uint32_t j = 0; j < k; ++j) {
        // volatile: the product rounded on its own, as the shader's precise one
        const volatile float prod = w[t * k + j] * eo[route[S + t * k + j] * n + c];
        acc = acc + prod;
      }
      ASSERT_EQ(o[t * n + c], acc) << "token " << t << ", element " << c;
      const volatile float shared = sig[t] * sh[t * n + c];
      ASSERT_EQ(o2[t * n + c], acc + shared) << "shared, token " << t << ", element " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, KernelTest, ::testing::Values(0, 1, 2),
                         [](const auto& param_info) {
                           return param_info.param == 0   ? "shared_memory"
                                  : param_info.param == 1 ? "subgroup"
                                                          : "row_per_invocation";
                         });

}  // namespace
}  // namespace touchstone::vk
