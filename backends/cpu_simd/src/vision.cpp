// vision.cpp - see vision.h. fp32 throughout: OpenBLAS sgemm for the products, plain
// loops (fp32 accumulation, rounded as they go) for LayerNorm, softmax, GELU and pooling.
#include "vision.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "touchstone/model/scalar_ops.h"

namespace touchstone::cpu_simd {
namespace {

// y [rows][out] = x [rows][in] . w^T (+ b), w [out][in] as stored.
std::vector<float> linear(const std::vector<float>& x, size_t rows, size_t in,
                          const std::vector<float>& w, const std::vector<float>* b, size_t out) {
  std::vector<float> y(rows * out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(out), int(in), 1.0f, x.data(),
              int(in), w.data(), int(in), 0.0f, y.data(), int(out));
  if (b)
    for (size_t r = 0; r < rows; ++r)
      for (size_t o = 0; o < out; ++o) y[r * out + o] += (*b)[o];
  return y;
}

// torch.nn.LayerNorm of each row (biased variance), fp32.
std::vector<float> layer_norm(const std::vector<float>& x, size_t rows, size_t d,
                              const std::vector<float>& w, const std::vector<float>& b,
                              double eps) {
  std::vector<float> y(x.size());
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * d;
    float mean = 0.0f, var = 0.0f;
    for (size_t i = 0; i < d; ++i) mean += xr[i];
    mean /= float(d);
    for (size_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / std::sqrt(var / float(d) + float(eps));
    for (size_t i = 0; i < d; ++i) y[r * d + i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
  return y;
}

// Every patch attends every patch, per head: softmax(Q K^T / sqrt(hd)) V.
std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, size_t n, size_t d, size_t heads) {
  const size_t hd = d / heads;
  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> out(n * d), s(n * n);
  for (size_t h = 0; h < heads; ++h) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(hd), scale,
                q.data() + h * hd, int(d), k.data() + h * hd, int(d), 0.0f, s.data(), int(n));
    for (size_t i = 0; i < n; ++i) {
      float* row = s.data() + i * n;
      const float mx = *std::max_element(row, row + n);
      float sum = 0.0f;
      for (size_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (size_t j = 0; j < n; ++j) row[j] /= sum;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(hd), int(n), 1.0f, s.data(),
                int(n), v.data() + h * hd, int(d), 0.0f, out.data() + h * hd, int(d));
  }
  return out;
}

void add_into(std::vector<float>& x, const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

}  // namespace

SimdVision::SimdVision(const std::string& path)
    : path_(path), t_(vision::load_vision_tower(path)) {}

// image_resample_filter: bilinear where the processor says bicubic or lanczos (Idefics3's
// LANCZOS), bicubic where it says bilinear (Gemma 3).
vision::PromptImage SimdVision::preprocess(const vision::Image& rgb) const {
  std::optional<vision::Filter> wrong;
  if (faults_.image_resample_filter)
    wrong = t_.config.projector == "idefics3" ? vision::Filter::Bilinear : vision::Filter::Bicubic;
  return vision::prompt_image(rgb, t_.config, path_, wrong);
}

// The patch convolution (kernel = stride = p) as im2col . W^T, plus bias and position.
std::vector<float> SimdVision::patches(const float* px) const {
  const vision::VisionTowerConfig& c = t_.config;
  const size_t s = size_t(c.grid()), p = size_t(c.patch_size), d = size_t(c.n_embd);
  const size_t W = size_t(c.image_size), kk = 3 * p * p;
  std::vector<float> cols(s * s * kk);
  for (size_t row = 0; row < s; ++row)
    for (size_t col = 0; col < s; ++col)
      for (size_t ch = 0; ch < 3; ++ch)
        for (size_t ky = 0; ky < p; ++ky)
          for (size_t kx = 0; kx < p; ++kx)
            cols[(row * s + col) * kk + (ch * p + ky) * p + kx] =
                px[(ch * W + row * p + ky) * W + col * p + kx];
  std::vector<float> x = linear(cols, s * s, kk, t_.patch_w, &t_.patch_b, d);
  add_into(x, t_.pos);
  return x;
}

void SimdVision::layer(const vision::VisionLayer& L, std::vector<float>& x) const {
  const vision::VisionTowerConfig& c = t_.config;
  const size_t n = size_t(c.n_patches()), d = size_t(c.n_embd), ff = size_t(c.n_ff);
  const std::vector<float> h = layer_norm(x, n, d, L.ln1_w, L.ln1_b, c.eps);
  const std::vector<float> q = linear(h, n, d, L.q_w, &L.q_b, d);
  const std::vector<float> k = linear(h, n, d, L.k_w, &L.k_b, d);
  const std::vector<float> v = linear(h, n, d, L.v_w, &L.v_b, d);
  add_into(x, linear(attention(q, k, v, n, d, size_t(c.n_head)), n, d, L.o_w, &L.o_b, d));
  std::vector<float> u =
      linear(layer_norm(x, n, d, L.ln2_w, L.ln2_b, c.eps), n, d, L.up_w, &L.up_b, ff);
  for (float& e : u) e = static_cast<float>(ops::gelu_tanh(e));  // gelu_pytorch_tanh
  add_into(x, linear(u, n, ff, L.down_w, &L.down_b, d));
}

// Gemma 3: k x k average pool, RMSNorm (1 + w), x . W_in. Idefics3: pixel shuffle, x . W_fc^T.
void SimdVision::project(const std::vector<float>& x, float* out) const {
  const vision::VisionTowerConfig& c = t_.config;
  const size_t s = size_t(c.grid()), k = size_t(c.pool), t = s / k, d = size_t(c.n_embd);
  const size_t dt = size_t(c.n_embd_text);
  if (c.projector == "idefics3") {
    const size_t din = d * k * k;
    std::vector<float> shuffled(t * t * din);
    for (size_t i = 0; i < t; ++i)
      for (size_t j = 0; j < t; ++j)
        for (size_t r = 0; r < k; ++r)
          for (size_t cc = 0; cc < k; ++cc)
            std::copy_n(x.data() + ((i * k + r) * s + j * k + cc) * d, d,
                        shuffled.data() + (i * t + j) * din + (r * k + cc) * d);
    const std::vector<float> y = linear(shuffled, t * t, din, t_.mm_fc, nullptr, dt);
    std::copy(y.begin(), y.end(), out);
    return;
  }
  std::vector<float> a(t * t * d, 0.0f);
  for (size_t ty = 0; ty < t; ++ty)
    for (size_t tx = 0; tx < t; ++tx) {
      float* ar = a.data() + (ty * t + tx) * d;
      for (size_t y = ty * k; y < (ty + 1) * k; ++y)
        for (size_t xx = tx * k; xx < (tx + 1) * k; ++xx)
          for (size_t i = 0; i < d; ++i) ar[i] += x[(y * s + xx) * d + i];
      float ss = 0.0f;
      for (size_t i = 0; i < d; ++i) {
        ar[i] /= float(k * k);
        ss += ar[i] * ar[i];
      }
      const float inv = 1.0f / std::sqrt(ss / float(d) + float(c.eps));
      for (size_t i = 0; i < d; ++i) ar[i] = ar[i] * inv * t_.mm_norm[i];
    }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(t * t), int(dt), int(d), 1.0f,
              a.data(), int(d), t_.mm_proj.data(), int(dt), 0.0f, out, int(dt));
}

void SimdVision::encode(const float* pixels, float* out) const {
  const vision::VisionTowerConfig& c = t_.config;
  std::vector<float> x = patches(pixels);
  for (const vision::VisionLayer& L : t_.layers) layer(L, x);
  std::vector<float> y =
      layer_norm(x, size_t(c.n_patches()), size_t(c.n_embd), t_.post_w, t_.post_b, c.eps);
  if (faults_.projector_grid_transposed) {  // patch (row, col) handed over as (col, row)
    const size_t s = size_t(c.grid()), d = size_t(c.n_embd);
    for (size_t r = 0; r < s; ++r)
      for (size_t col = r + 1; col < s; ++col)
        std::swap_ranges(y.begin() + std::ptrdiff_t((r * s + col) * d),
                         y.begin() + std::ptrdiff_t((r * s + col + 1) * d),
                         y.begin() + std::ptrdiff_t((col * s + r) * d));
  }
  project(y, out);
}

}  // namespace touchstone::cpu_simd
