// touchstone/vision/image.h - an 8-bit image as the image processors of vision-language
// models receive it, and PNG files read and written with libpng.
//
// Pixels are rows top to bottom, each row left to right, channels interleaved
// (HWC, as PIL's "L" and "RGB" modes and a numpy array of a PIL image):
// pixels[(y * width + x) * channels + c].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::vision {

struct Image {
  int width = 0, height = 0;
  int channels = 0;  // 1 (PIL mode "L") or 3 ("RGB"); read with alpha: also 2 ("LA"), 4 ("RGBA")
  std::vector<uint8_t> pixels;  // height * width * channels bytes
  uint8_t at(int y, int x, int c) const {
    return pixels[(static_cast<size_t>(y) * width + x) * channels + c];
  }
};

// An RGB image from height x width x 3 bytes (ABI ts_image TS_IMAGE_RGB8), copied.
inline Image rgb8_image(const uint8_t* rgb, int height, int width) {
  const size_t n = static_cast<size_t>(height) * static_cast<size_t>(width) * 3;
  return Image{width, height, 3, std::vector<uint8_t>(rgb, rgb + n)};
}

// A PNG file as PIL's Image.open(path).convert(...) gives it for 8-bit files:
// gray and gray + alpha as 1 channel ("L"), RGB, RGBA and palette images as 3
// ("RGB"): alpha dropped without compositing, palette expanded, transparency
// ignored, as PIL's convert("L") / convert("RGB") do. Throws touchstone::Error
// naming the file and libpng's reason for a file that is missing, not a PNG,
// truncated or corrupt, and for 16-bit samples (PIL reads those as mode "I;16"
// or "RGB" with rounding of its own, which no processor here takes). keep_alpha: the
// alpha channel stays (PIL's own mode "LA" or "RGBA"), tRNS transparency (palette,
// gray or RGB) becoming one, as PIL's convert("RGBA") does.
Image read_png(const std::string& path, bool keep_alpha = false);

// Writes an 8-bit gray (1 channel) or RGB (3) PNG; throws Error naming the file.
void write_png(const std::string& path, const Image& image);

// Gray replicated into R, G and B (PIL's convert("RGB") of an "L" image); an RGB
// image is returned as it is.
Image to_rgb(const Image& image);

// What Hugging Face's image processors do with do_convert_rgb
// (transformers.image_transforms.convert_to_rgb): an RGB image as it is; any other mode
// converted to RGBA (gray replicated, opaque without alpha) and alpha-composited over an
// opaque white image (PIL Image.alpha_composite: Pillow's integer formula,
// src/libImaging/AlphaComposite.c), then the alpha dropped. A transparent pixel becomes
// white, not its stored colour (PIL's convert("RGB") keeps the colour).
Image convert_to_rgb(const Image& image);

}  // namespace touchstone::vision
