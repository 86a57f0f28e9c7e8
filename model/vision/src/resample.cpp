// resample.cpp - Pillow's convolution resize for 8-bit images
// (touchstone/vision/resample.h; Pillow src/libImaging/Resample.c).
#include "touchstone/vision/resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "touchstone/common/error.h"

namespace touchstone::vision {
namespace {

// Resample.c's PRECISION_BITS (32 - 8 - 2): coefficients are 2^22 fixed point.
constexpr int kPrecisionBits = 22;

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_filter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * M_PI;
  // 0.54f and 0.46f are float constants in Pillow, widened to double.
  return std::sin(x) / x * (static_cast<double>(0.54f) + static_cast<double>(0.46f) * std::cos(x));
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return std::sin(x) / x;
}

double lanczos_filter(double x) {
  return (-3.0 <= x && x < 3.0) ? sinc_filter(x) * sinc_filter(x / 3) : 0.0;
}

struct FilterDef {
  double (*fn)(double);
  double support;
};

FilterDef filter_def(Filter f) {
  switch (f) {
    case Filter::Box:
      return {box_filter, 0.5};
    case Filter::Bilinear:
      return {bilinear_filter, 1.0};
    case Filter::Hamming:
      return {hamming_filter, 1.0};
    case Filter::Bicubic:
      return {bicubic_filter, 2.0};
    case Filter::Lanczos:
      return {lanczos_filter, 3.0};
  }
  throw Error("resize: unknown filter");
}

// One output position's taps: source indices [first, first + k.size()) with
// their fixed-point weights.
struct Taps {
  int first = 0;
  std::vector<int32_t> k;
};

// precompute_coeffs + normalize_coeffs_8bpc for one axis (box = the whole axis).
std::vector<Taps> coefficients(int in_size, int out_size, const FilterDef& f) {
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = f.support * filterscale;
  const double ss = 1.0 / filterscale;
  std::vector<Taps> taps(static_cast<size_t>(out_size));
  std::vector<double> w;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    w.assign(static_cast<size_t>(std::max(xmax, 0)), 0.0);
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = f.fn((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    Taps& t = taps[xx];
    t.first = xmin;
    for (int x = 0; x < xmax; ++x) {
      const double v = (ww != 0.0 ? w[x] / ww : w[x]) * (1 << kPrecisionBits);
      t.k.push_back(static_cast<int32_t>(v < 0 ? -0.5 + v : 0.5 + v));
    }
  }
  return taps;
}

uint8_t clip8(int32_t ss) { return static_cast<uint8_t>(std::clamp(ss >> kPrecisionBits, 0, 255)); }

// The horizontal pass over rows [y0, y1) of `in`.
Image horizontal(const Image& in, int y0, int y1, const std::vector<Taps>& taps) {
  Image out{static_cast<int>(taps.size()), y1 - y0, in.channels, {}};
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * out.channels);
  const int C = in.channels;
  for (int y = y0; y < y1; ++y) {
    const uint8_t* row = in.pixels.data() + static_cast<size_t>(y) * in.width * C;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y - y0) * out.width * C;
    for (int xx = 0; xx < out.width; ++xx) {
      const Taps& t = taps[xx];
      for (int c = 0; c < C; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (size_t x = 0; x < t.k.size(); ++x) ss += row[(t.first + x) * C + c] * t.k[x];
        dst[xx * C + c] = clip8(ss);
      }
    }
  }
  return out;
}

// The vertical pass; taps index rows of `in` after subtracting `row0`.
Image vertical(const Image& in, int row0, const std::vector<Taps>& taps) {
  Image out{in.width, static_cast<int>(taps.size()), in.channels, {}};
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * out.channels);
  const size_t stride = static_cast<size_t>(in.width) * in.channels;
  for (int yy = 0; yy < out.height; ++yy) {
    const Taps& t = taps[yy];
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(yy) * stride;
    for (size_t i = 0; i < stride; ++i) {
      int32_t ss = 1 << (kPrecisionBits - 1);
      for (size_t y = 0; y < t.k.size(); ++y)
        ss += in.pixels[(t.first - row0 + y) * stride + i] * t.k[y];
      dst[i] = clip8(ss);
    }
  }
  return out;
}

}  // namespace

Filter parse_filter(const std::string& name) {
  for (Filter f :
       {Filter::Box, Filter::Bilinear, Filter::Hamming, Filter::Bicubic, Filter::Lanczos})
    if (name == filter_name(f)) return f;
  throw Error("unknown resampling filter '{}' (known: box, bilinear, hamming, bicubic, lanczos)",
              name);
}

const char* filter_name(Filter f) {
  switch (f) {
    case Filter::Box:
      return "box";
    case Filter::Bilinear:
      return "bilinear";
    case Filter::Hamming:
      return "hamming";
    case Filter::Bicubic:
      return "bicubic";
    case Filter::Lanczos:
      return "lanczos";
  }
  return "?";
}

Filter filter_from_pil(int code) {
  switch (code) {
    case 1:
      return Filter::Lanczos;
    case 2:
      return Filter::Bilinear;
    case 3:
      return Filter::Bicubic;
    case 4:
      return Filter::Box;
    case 5:
      return Filter::Hamming;
    default:
      throw Error(
          "PIL resample {} is not supported (1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX, "
          "5 HAMMING; 0 NEAREST is not a convolution filter)",
          code);
  }
}

Image resize(const Image& in, int width, int height, Filter f) {
  if (width < 1 || height < 1) throw Error("resize: size {}x{} (both must be >= 1)", width, height);
  if (in.channels != 1 && in.channels != 3)
    throw Error("resize: {} channels (expected 1 or 3)", in.channels);
  if (width == in.width && height == in.height) return in;  // Image.resize returns a copy
  const FilterDef def = filter_def(f);
  const std::vector<Taps> vt = coefficients(in.height, height, def);
  if (width == in.width) return vertical(in, 0, vt);
  const std::vector<Taps> ht = coefficients(in.width, width, def);
  if (height == in.height) return horizontal(in, 0, in.height, ht);
  // The horizontal pass covers the source rows the vertical taps read.
  const int first = vt.front().first;
  const int last = vt.back().first + static_cast<int>(vt.back().k.size());
  return vertical(horizontal(in, first, last, ht), first, vt);
}

}  // namespace touchstone::vision
