// image_splitting.cpp - Idefics3's image processor (touchstone/vision/image_splitting.h).
#include "touchstone/vision/image_splitting.h"

#include <algorithm>
#include <cmath>

#include "touchstone/common/error.h"
#include "touchstone/vision/resample.h"

namespace touchstone::vision {
namespace {

// Step 1 (get_resize_output_image_size): {height, width}.
std::pair<int, int> longest_edge_size(int h, int w, int L) {
  const double aspect = double(w) / double(h);
  if (w >= h) {
    w = L;
    h = int(double(w) / aspect);
    if (h % 2 != 0) ++h;
  } else {
    h = L;
    w = int(double(h) * aspect);
    if (w % 2 != 0) ++w;
  }
  h = std::max(h, 1);
  w = std::max(w, 1);
  const int kMax = 4096;  // MAX_IMAGE_SIZE
  const double a2 = double(w) / double(h);
  if (w >= h && w > kMax) {
    w = kMax;
    h = int(double(w) / a2);
  } else if (h > w && h > kMax) {
    h = kMax;
    w = int(double(h) * a2);
  }
  return {std::max(h, 1), std::max(w, 1)};
}

// Step 2 (resize_for_vision_encoder): {height, width}, multiples of M.
std::pair<int, int> tile_multiple_size(int h, int w, int M) {
  const double aspect = double(w) / double(h);
  auto up = [M](double v) { return int(std::ceil(v / double(M))) * M; };
  if (w >= h) {
    w = up(double(w));
    h = up(double(int(double(w) / aspect)));
  } else {
    h = up(double(h));
    w = up(double(int(double(h) * aspect)));
  }
  return {h, w};
}

// The rows [y0, y0 + M) and columns [x0, x0 + M) of an RGB image.
Image crop(const Image& im, int y0, int x0, int M) {
  Image out{M, M, 3, {}};
  out.pixels.reserve(size_t(M) * M * 3);
  for (int y = y0; y < y0 + M; ++y) {
    const uint8_t* row = im.pixels.data() + (size_t(y) * im.width + x0) * 3;
    out.pixels.insert(out.pixels.end(), row, row + size_t(M) * 3);
  }
  return out;
}

}  // namespace

std::vector<PixelValues> split_image(const Image& image, const SplittingProcessor& p) {
  return split_image_grid(image, p).frames;
}

SplitImage split_image_grid(const Image& image, const SplittingProcessor& p) {
  if (p.tile < 1 || p.longest_edge < 1)
    throw Error("split_image: tile {} and longest edge {} must be at least 1", p.tile,
                p.longest_edge);
  const Image rgb = convert_to_rgb(image);
  const auto [h1, w1] = longest_edge_size(rgb.height, rgb.width, p.longest_edge);
  const Image a = resize(rgb, w1, h1, p.resample);
  const auto [h2, w2] = tile_multiple_size(h1, w1, p.tile);
  const Image b = resize(a, w2, h2, p.resample);
  std::vector<Image> frames;
  SplitImage out;
  const int M = p.tile;
  if (h2 > M || w2 > M) {
    out.rows = (h2 - M) / M + 1;
    out.cols = (w2 - M) / M + 1;
    for (int r = 0; r < out.rows; ++r)
      for (int c = 0; c < out.cols; ++c) frames.push_back(crop(b, r * M, c * M, M));
    frames.push_back(resize(b, M, M, p.resample));
  } else {
    frames.push_back(b);
  }
  for (const Image& f : frames)
    out.frames.push_back(rescale_normalize(f, p.rescale_factor, p.mean, p.std));
  return out;
}

}  // namespace touchstone::vision
