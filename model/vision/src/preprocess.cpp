// preprocess.cpp - Hugging Face image processors' resize, rescale and normalise
// (touchstone/vision/preprocess.h).
#include "touchstone/vision/preprocess.h"

#include <fmt/format.h>

#include "touchstone/common/error.h"

namespace touchstone::vision {

const std::vector<ImageProcessor>& image_processors() {
  // Gemma3ImageProcessor with google/gemma-3-4b-it's preprocessor_config.json:
  // "size": {"height": 896, "width": 896}, "resample": 2 (BILINEAR),
  // "rescale_factor": 0.00392156862745098, "image_mean" = "image_std" = [0.5, 0.5, 0.5]
  // (do_pan_and_scan off, the default).
  static const std::vector<ImageProcessor> all = {
      {"gemma3", 896, 896, Filter::Bilinear, 0.00392156862745098, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}},
  };
  return all;
}

const ImageProcessor& find_processor(const std::string& name) {
  std::string known;
  for (const ImageProcessor& p : image_processors()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("unknown image processor '{}' (known: {})", name, known);
}

PixelValues rescale_normalize(const Image& rgb, double rescale_factor,
                              const std::array<double, 3>& mean, const std::array<double, 3>& std) {
  if (rgb.channels != 3) throw Error("rescale_normalize: {} channels (expected RGB)", rgb.channels);
  PixelValues out{3, rgb.height, rgb.width, {}};
  out.values.resize(static_cast<size_t>(3) * rgb.height * rgb.width);
  for (int c = 0; c < 3; ++c) {
    // normalize() casts mean and std to the image's dtype (float32) first.
    const float m = static_cast<float>(mean[c]), s = static_cast<float>(std[c]);
    for (int y = 0; y < rgb.height; ++y) {
      for (int x = 0; x < rgb.width; ++x) {
        const float v = static_cast<float>(static_cast<double>(rgb.at(y, x, c)) * rescale_factor);
        out.values[(static_cast<size_t>(c) * rgb.height + y) * rgb.width + x] = (v - m) / s;
      }
    }
  }
  return out;
}

PixelValues preprocess(const Image& image, const ImageProcessor& p) {
  const Image rgb = resize(convert_to_rgb(image), p.width, p.height, p.resample);
  return rescale_normalize(rgb, p.rescale_factor, p.mean, p.std);
}

}  // namespace touchstone::vision
