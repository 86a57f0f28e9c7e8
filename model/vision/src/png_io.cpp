// png_io.cpp - PNG files read and written with libpng (touchstone/vision/image.h).
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/vision/image.h"

namespace touchstone::vision {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};

// libpng reports errors through a callback that must not return: the message
// is kept and control jumps back to the setjmp in the caller.
struct PngError {
  std::string message;
  std::jmp_buf jump;
};

void on_error(png_structp png, png_const_charp msg) {
  auto* e = static_cast<PngError*>(png_get_error_ptr(png));
  e->message = msg ? msg : "unknown libpng error";
  std::longjmp(e->jump, 1);
}

void on_warning(png_structp, png_const_charp) {}

// The header and the transforms to 8-bit gray or RGB (keep_alpha: plus an alpha channel
// where the file has alpha or tRNS transparency); false (err.message set) on a libpng
// error. No object with a destructor lives here: longjmp skips destructors.
bool read_header(png_structp png, png_infop info, FILE* f, PngError& err, bool keep_alpha) {
  if (setjmp(err.jump)) return false;
  png_init_io(png, f);
  png_set_sig_bytes(png, 8);
  png_read_info(png, info);
  const int depth = png_get_bit_depth(png, info);
  const int type = png_get_color_type(png, info);
  if (depth == 16) return false;  // err.message stays empty: the caller names it
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (keep_alpha && png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  // Also the alpha that png_set_palette_to_rgb makes of a palette's tRNS entries.
  if (!keep_alpha) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  return true;
}

bool read_rows(png_structp png, png_bytepp rows, PngError& err) {
  if (setjmp(err.jump)) return false;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  return true;
}

// Reads the opened PNG (signature consumed) into out.
bool read_into(png_structp png, png_infop info, FILE* f, PngError& err, Image& out,
               bool keep_alpha) {
  if (!read_header(png, info, f, err, keep_alpha)) {
    if (err.message.empty()) err.message = "16-bit samples are not supported (8-bit images only)";
    return false;
  }
  out.width = static_cast<int>(png_get_image_width(png, info));
  out.height = static_cast<int>(png_get_image_height(png, info));
  out.channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  out.pixels.resize(row_bytes * out.height);
  std::vector<png_bytep> rows(static_cast<size_t>(out.height));
  for (int y = 0; y < out.height; ++y) rows[y] = out.pixels.data() + y * row_bytes;
  return read_rows(png, rows.data(), err);
}

}  // namespace

Image read_png(const std::string& path, bool keep_alpha) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error("{}: cannot open", path);
  unsigned char sig[8] = {};
  if (std::fread(sig, 1, 8, f.get()) != 8 || png_sig_cmp(sig, 0, 8) != 0)
    throw Error("{}: not a PNG file (bad signature at offset 0)", path);
  PngError err;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) throw Error("{}: libpng could not allocate its state", path);
  Image out;
  const bool ok = read_into(png, info, f.get(), err, out, keep_alpha);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!ok) {
    // Where libpng stopped: at the end of the file, the file is truncated.
    const long at = std::ftell(f.get());
    const bool at_end = std::fseek(f.get(), 0, SEEK_END) == 0 && std::ftell(f.get()) == at;
    if (at_end)
      throw Error("{}: truncated: the file ends at byte {} before its image data does ({})", path,
                  at, err.message);
    throw Error("{}: {} (libpng stopped reading at byte offset {})", path, err.message, at);
  }
  if (out.channels < 1 || out.channels > (keep_alpha ? 4 : 3) || (out.channels == 2 && !keep_alpha))
    throw Error("{}: {} channels after conversion (expected 1 or 3{})", path, out.channels,
                keep_alpha ? ", or 2 or 4 with alpha" : "");
  return out;
}

namespace {

bool write_from(png_structp png, png_infop info, FILE* f, PngError& err, const Image& im) {
  if (setjmp(err.jump)) return false;
  png_init_io(png, f);
  png_set_IHDR(png, info, im.width, im.height, 8,
               im.channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t stride = static_cast<size_t>(im.width) * im.channels;
  for (int y = 0; y < im.height; ++y)
    png_write_row(png, const_cast<png_bytep>(im.pixels.data() + y * stride));
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

void write_png(const std::string& path, const Image& image) {
  if (image.channels != 1 && image.channels != 3)
    throw Error("{}: cannot write {} channels (1 or 3)", path, image.channels);
  if (image.pixels.size() != static_cast<size_t>(image.width) * image.height * image.channels)
    throw Error("{}: pixel buffer of {} bytes for {}x{}x{}", path, image.pixels.size(), image.width,
                image.height, image.channels);
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) throw Error("{}: cannot create", path);
  PngError err;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &err, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) throw Error("{}: libpng could not allocate its state", path);
  const bool ok = write_from(png, info, f.get(), err, image);
  png_destroy_write_struct(&png, &info);
  if (!ok) throw Error("{}: {}", path, err.message);
  if (std::fclose(f.release()) != 0) throw Error("{}: write failed", path);
}

Image to_rgb(const Image& image) {
  if (image.channels == 3) return image;
  if (image.channels != 1) throw Error("to_rgb: {} channels (expected 1 or 3)", image.channels);
  Image out{image.width, image.height, 3, {}};
  out.pixels.reserve(image.pixels.size() * 3);
  for (uint8_t v : image.pixels) out.pixels.insert(out.pixels.end(), {v, v, v});
  return out;
}

}  // namespace touchstone::vision

namespace touchstone::vision {

// Pillow src/libImaging/AlphaComposite.c (ImagingAlphaComposite), scalar path, with the
// destination opaque white: blend = 255 (255 - a), outa255 = 255 a + blend = 65025,
// coef1 = a 255 255 128 / outa255, coef2 = 255 128 - coef1, and per colour
// out = SHIFTFORDIV255(src coef1 + 255 coef2 + (0x80 << 7)) >> 7, SHIFTFORDIV255(v) =
// ((v >> 8) + v) >> 8; a = 0 keeps the white destination.
uint8_t composite_on_white(uint32_t v, uint32_t a) {
  if (a == 0) return 255;
  const uint32_t outa255 = a * 255 + 255 * (255 - a);
  const uint32_t coef1 = a * 255 * 255 * (1u << 7) / outa255, coef2 = 255 * (1u << 7) - coef1;
  const uint32_t t = v * coef1 + 255 * coef2 + (0x80u << 7);
  return static_cast<uint8_t>(((((t >> 8) + t) >> 8)) >> 7);
}

Image convert_to_rgb(const Image& image) {
  if (image.channels == 3) return image;
  if (image.channels < 1 || image.channels > 4)
    throw Error("convert_to_rgb: {} channels (expected 1 to 4)", image.channels);
  const bool gray = image.channels <= 2, alpha = image.channels % 2 == 0;
  Image out{image.width, image.height, 3, {}};
  out.pixels.reserve(size_t(image.width) * image.height * 3);
  const size_t n = size_t(image.width) * image.height, ch = size_t(image.channels);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = image.pixels.data() + i * ch;
    const uint32_t a = alpha ? p[ch - 1] : 255;
    for (int c = 0; c < 3; ++c) out.pixels.push_back(composite_on_white(p[gray ? 0 : c], a));
  }
  return out;
}

}  // namespace touchstone::vision
