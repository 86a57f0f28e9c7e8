// vision_tower.cpp - the SigLIP encoder and Gemma 3's projector (formulas and sources in
// touchstone/vision/vision_tower.h). Every sum in fp64, each operation's output rounded
// once to fp32, as the text reference (reference_forward.cpp).
#include <algorithm>
#include <cmath>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/scalar_ops.h"
#include "touchstone/vision/vision_tower.h"

namespace touchstone::vision {
namespace {

// y[r][o] = sum_i w[o][i] x[r][i] + b[o] for the rows r of x [rows][in]; w [out][in].
std::vector<float> linear(const std::vector<float>& x, size_t rows, size_t in,
                          const std::vector<float>& w, const std::vector<float>& b, size_t out) {
  std::vector<float> y(rows * out);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * in;
    for (size_t o = 0; o < out; ++o) {
      const float* wo = w.data() + o * in;
      double s = 0.0;
      for (size_t i = 0; i < in; ++i) s += double{wo[i]} * double{xr[i]};
      y[r * out + o] = static_cast<float>(s + double{b[o]});
    }
  }
  return y;
}

// LayerNorm of each row of x [rows][d]: (x - mean) / sqrt(var + eps) * w + b (biased variance,
// torch.nn.LayerNorm).
std::vector<float> layer_norm(const std::vector<float>& x, size_t rows, size_t d,
                              const std::vector<float>& w, const std::vector<float>& b,
                              double eps) {
  std::vector<float> y(x.size());
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * d;
    double mean = 0.0, var = 0.0;
    for (size_t i = 0; i < d; ++i) mean += xr[i];
    mean /= double(d);
    for (size_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const double inv = 1.0 / std::sqrt(var / double(d) + eps);
    for (size_t i = 0; i < d; ++i)
      y[r * d + i] = static_cast<float>((xr[i] - mean) * inv * w[i] + b[i]);
  }
  return y;
}

// Multi-head attention of every patch over every patch: [n][d] from q, k, v [n][d].
std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, size_t n, size_t d, size_t heads) {
  const size_t hd = d / heads;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<float> out(n * d);
  std::vector<double> p(n);
  for (size_t h = 0; h < heads; ++h) {
    for (size_t i = 0; i < n; ++i) {
      double mx = -INFINITY;
      for (size_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (size_t c = 0; c < hd; ++c) s += double{q[i * d + h * hd + c]} * k[j * d + h * hd + c];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (size_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (size_t c = 0; c < hd; ++c) {
        double o = 0.0;
        for (size_t j = 0; j < n; ++j) o += p[j] * v[j * d + h * hd + c];
        out[i * d + h * hd + c] = static_cast<float>(o / sum);
      }
    }
  }
  return out;
}

void add_into(std::vector<float>& x, const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(double{x[i]} + y[i]);
}

// One encoder layer on x [n][d], in place.
void encoder_layer(const VisionLayer& L, const VisionTowerConfig& c, std::vector<float>& x) {
  const size_t n = size_t(c.n_patches()), d = size_t(c.n_embd), ff = size_t(c.n_ff);
  const std::vector<float> h = layer_norm(x, n, d, L.ln1_w, L.ln1_b, c.eps);
  const std::vector<float> q = linear(h, n, d, L.q_w, L.q_b, d);
  const std::vector<float> k = linear(h, n, d, L.k_w, L.k_b, d);
  const std::vector<float> v = linear(h, n, d, L.v_w, L.v_b, d);
  add_into(x, linear(attention(q, k, v, n, d, size_t(c.n_head)), n, d, L.o_w, L.o_b, d));
  std::vector<float> u =
      linear(layer_norm(x, n, d, L.ln2_w, L.ln2_b, c.eps), n, d, L.up_w, L.up_b, ff);
  for (float& e : u) e = static_cast<float>(ops::gelu_tanh(e));  // gelu_pytorch_tanh
  add_into(x, linear(u, n, ff, L.down_w, L.down_b, d));
}

}  // namespace

std::vector<float> encode_patches(const VisionTower& tower, const PixelValues& px) {
  const VisionTowerConfig& c = tower.config;
  if (px.channels != 3 || px.height != c.image_size || px.width != c.image_size)
    throw Error("{}: the vision tower takes 3 x {} x {} pixel values, got {} x {} x {}", tower.path,
                c.image_size, c.image_size, px.channels, px.height, px.width);
  const size_t s = size_t(c.grid()), p = size_t(c.patch_size), d = size_t(c.n_embd);
  const size_t W = size_t(c.image_size);
  std::vector<float> x(s * s * d);
  for (size_t row = 0; row < s; ++row) {
    for (size_t col = 0; col < s; ++col) {
      const size_t n = row * s + col;
      for (size_t o = 0; o < d; ++o) {  // conv2d, kernel = stride = p
        double acc = 0.0;
        for (size_t ch = 0; ch < 3; ++ch)
          for (size_t ky = 0; ky < p; ++ky)
            for (size_t kx = 0; kx < p; ++kx)
              acc += double{tower.patch_w[((o * 3 + ch) * p + ky) * p + kx]} *
                     px.values[(ch * W + row * p + ky) * W + col * p + kx];
        const float conv = static_cast<float>(acc + double{tower.patch_b[o]});
        x[n * d + o] = static_cast<float>(double{conv} + tower.pos[n * d + o]);
      }
    }
  }
  for (const VisionLayer& L : tower.layers) encoder_layer(L, c, x);
  return layer_norm(x, s * s, d, tower.post_w, tower.post_b, c.eps);
}

namespace {

// Idefics3's connector: pixel shuffle by k, then W_fc (no bias); see the header.
std::vector<float> pixel_shuffle_project(const VisionTower& tower,
                                         const std::vector<float>& patches) {
  const VisionTowerConfig& c = tower.config;
  const size_t s = size_t(c.grid()), k = size_t(c.pool), t = s / k, d = size_t(c.n_embd);
  const size_t dt = size_t(c.n_embd_text), din = d * k * k;
  std::vector<float> out(t * t * dt), x(din);
  for (size_t i = 0; i < t; ++i) {
    for (size_t j = 0; j < t; ++j) {
      for (size_t r = 0; r < k; ++r)
        for (size_t cc = 0; cc < k; ++cc)
          for (size_t e = 0; e < d; ++e)
            x[(r * k + cc) * d + e] = patches[((i * k + r) * s + j * k + cc) * d + e];
      for (size_t o = 0; o < dt; ++o) {
        double acc = 0.0;
        for (size_t f = 0; f < din; ++f) acc += double{tower.mm_fc[o * din + f]} * x[f];
        out[(i * t + j) * dt + o] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<float> project(const VisionTower& tower, const std::vector<float>& patches) {
  const VisionTowerConfig& c = tower.config;
  const size_t s = size_t(c.grid()), k = size_t(c.pool), t = s / k, d = size_t(c.n_embd);
  const size_t dt = size_t(c.n_embd_text);
  if (patches.size() != s * s * d)
    throw Error("{}: the projector takes {} x {} patch vectors, got {} values", tower.path, s * s,
                d, patches.size());
  if (c.projector == "idefics3") return pixel_shuffle_project(tower, patches);
  std::vector<float> out(t * t * dt);
  std::vector<double> pooled(d);
  for (size_t ty = 0; ty < t; ++ty) {
    for (size_t tx = 0; tx < t; ++tx) {
      // nn.AvgPool2d(k, stride k) over the [d][s][s] grid, then RMSNorm.
      std::fill(pooled.begin(), pooled.end(), 0.0);
      for (size_t y = ty * k; y < (ty + 1) * k; ++y)
        for (size_t x = tx * k; x < (tx + 1) * k; ++x)
          for (size_t i = 0; i < d; ++i) pooled[i] += patches[(y * s + x) * d + i];
      std::vector<float> a(d);
      for (size_t i = 0; i < d; ++i) a[i] = static_cast<float>(pooled[i] / double(k * k));
      double ss = 0.0;
      for (size_t i = 0; i < d; ++i) ss += double{a[i]} * a[i];
      const double inv = 1.0 / std::sqrt(ss / double(d) + c.eps);
      for (size_t i = 0; i < d; ++i) a[i] = static_cast<float>(a[i] * inv * tower.mm_norm[i]);
      float* o = out.data() + (ty * t + tx) * dt;
      for (size_t j = 0; j < dt; ++j) {
        double acc = 0.0;
        for (size_t i = 0; i < d; ++i) acc += double{a[i]} * tower.mm_proj[i * dt + j];
        o[j] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

}  // namespace touchstone::vision
