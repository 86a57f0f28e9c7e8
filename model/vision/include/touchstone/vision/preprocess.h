// touchstone/vision/preprocess.h - an image turned into a vision encoder's pixel
// values as a Hugging Face image processor does it: convert to RGB, resize,
// rescale, normalise, channels first.
//
// Source: transformers.image_transforms (the numpy image processors):
//   rescale:   v = float32(float64(u8) * rescale_factor)
//   normalize: v = (v - float32(mean_c)) / float32(std_c), in float32
// and resize through PIL (touchstone/vision/resample.h). The result is laid out
// [channel][y][x] (pixel_values of one image, float32).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "touchstone/vision/image.h"
#include "touchstone/vision/resample.h"

namespace touchstone::vision {

// What one processor does (the fields of a preprocessor_config.json).
struct ImageProcessor {
  std::string name;
  int width = 0, height = 0;  // size {"width", "height"}
  Filter resample = Filter::Bilinear;
  double rescale_factor = 1.0 / 255.0;  // as the JSON's double, e.g. 0.00392156862745098
  std::array<double, 3> mean{}, std{};  // image_mean, image_std
};

// The processors Touchstone knows, by name ("gemma3": Gemma3ImageProcessor as
// configured by google/gemma-3-*-it's preprocessor_config.json, without pan and
// scan: 896 x 896 bilinear, rescale 1/255, mean = std = 0.5). Throws Error
// naming the known ones for another name.
const ImageProcessor& find_processor(const std::string& name);
const std::vector<ImageProcessor>& image_processors();

// Pixel values of one image: channels x height x width float32, channels first.
struct PixelValues {
  int channels = 0, height = 0, width = 0;
  std::vector<float> values;  // values[(c * height + y) * width + x]
};

// Rescale and normalise, channels first (no resize). Throws Error unless the
// image has 3 channels.
PixelValues rescale_normalize(const Image& rgb, double rescale_factor,
                              const std::array<double, 3>& mean, const std::array<double, 3>& std);

// The whole processor: convert_to_rgb (image.h: alpha composited over white, as the HF
// processors do), resize to its size with its filter, rescale_normalize.
PixelValues preprocess(const Image& image, const ImageProcessor& processor);

}  // namespace touchstone::vision
