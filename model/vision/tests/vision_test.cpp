// vision_test.cpp - touchstone_vision on its own: resize properties that hold for
// Pillow's arithmetic, PNG round trips and malformed files, rescale and normalise.
// (Bit-for-bit agreement with Pillow itself: tests/vision/pillow_crosscheck.py.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "touchstone/common/error.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/resample.h"

namespace {

namespace fs = std::filesystem;
using touchstone::vision::Filter;
using touchstone::vision::Image;

constexpr Filter kFilters[] = {Filter::Box, Filter::Bilinear, Filter::Hamming, Filter::Bicubic,
                               Filter::Lanczos};

Image noise(int w, int h, int c, unsigned seed) {
  std::mt19937 rng(seed);
  Image im{w, h, c, std::vector<uint8_t>(static_cast<size_t>(w) * h * c)};
  for (uint8_t& p : im.pixels) p = static_cast<uint8_t>(rng() & 0xff);
  return im;
}

TEST(Resize, AConstantImageStaysConstantUpAndDown) {
  for (Filter f : kFilters) {
    for (auto [w, h] : {std::pair{7, 5}, std::pair{64, 3}, std::pair{1, 1}, std::pair{300, 2}}) {
      Image im{31, 17, 3, std::vector<uint8_t>(31 * 17 * 3, 200)};
      const Image out = touchstone::vision::resize(im, w, h, f);
      ASSERT_EQ(out.pixels.size(), static_cast<size_t>(w) * h * 3);
      for (uint8_t p : out.pixels) ASSERT_EQ(p, 200) << touchstone::vision::filter_name(f) << w;
    }
  }
}

TEST(Resize, SameSizeIsACopy) {
  const Image im = noise(13, 9, 3, 1);
  EXPECT_EQ(touchstone::vision::resize(im, 13, 9, Filter::Lanczos).pixels, im.pixels);
}

// Box by exactly 2 in x: weights 1/2 each, 2^21 in fixed point, so each output is
// (2^21 + (a + b) 2^21) >> 22 = (a + b + 1) / 2 in integers.
TEST(Resize, BoxHalvingIsTheRoundedPairMean) {
  const Image im = noise(40, 6, 1, 2);
  const Image out = touchstone::vision::resize(im, 20, 6, Filter::Box);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 20; ++x)
      ASSERT_EQ(out.at(y, x, 0), (im.at(y, 2 * x, 0) + im.at(y, 2 * x + 1, 0) + 1) / 2) << x;
}

TEST(Resize, BadSizesAndFiltersAreErrors) {
  const Image im = noise(4, 4, 3, 3);
  EXPECT_THROW(touchstone::vision::resize(im, 0, 4, Filter::Box), touchstone::Error);
  EXPECT_THROW(touchstone::vision::parse_filter("nearest"), touchstone::Error);
  EXPECT_THROW(touchstone::vision::filter_from_pil(0), touchstone::Error);
  EXPECT_EQ(touchstone::vision::filter_from_pil(2), Filter::Bilinear);
  EXPECT_EQ(touchstone::vision::filter_from_pil(3), Filter::Bicubic);
  EXPECT_EQ(touchstone::vision::parse_filter("lanczos"), Filter::Lanczos);
}

fs::path temp(const char* name) { return fs::temp_directory_path() / name; }

TEST(Png, RoundTripsGrayAndRgb) {
  for (int c : {1, 3}) {
    const Image im = noise(23, 11, c, 4 + c);
    const fs::path p = temp("ts_vision_roundtrip.png");
    touchstone::vision::write_png(p.string(), im);
    const Image back = touchstone::vision::read_png(p.string());
    EXPECT_EQ(back.width, 23);
    EXPECT_EQ(back.channels, c);
    EXPECT_EQ(back.pixels, im.pixels);
    fs::remove(p);
  }
}

void expect_error(const fs::path& p, const std::string& needle) {
  try {
    touchstone::vision::read_png(p.string());
    ADD_FAILURE() << "read " << p;
  } catch (const touchstone::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(p.string()), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(Png, MalformedFilesNameTheFileAndTheReason) {
  const fs::path good = temp("ts_vision_good.png"), bad = temp("ts_vision_bad.png");
  touchstone::vision::write_png(good.string(), noise(64, 64, 3, 9));
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(bad, std::ios::binary) << bytes.substr(0, bytes.size() / 2);  // truncated
  expect_error(bad, "ts_vision_bad.png: ");
  std::ofstream(bad, std::ios::binary) << "GIF89a not a png";
  expect_error(bad, "not a PNG file");
  std::string flipped = bytes;
  flipped[40] = static_cast<char>(flipped[40] ^ 0x5a);  // inside IDAT or a CRC
  std::ofstream(bad, std::ios::binary) << flipped;
  expect_error(bad, "ts_vision_bad.png: ");
  expect_error(temp("ts_vision_missing.png"), "cannot open");
  fs::remove(good);
  fs::remove(bad);
}

TEST(Preprocess, RescaleAndNormaliseAsTransformersDoes) {
  Image im{3, 1, 3, {0, 0, 0, 128, 128, 128, 255, 255, 255}};
  const auto px = touchstone::vision::rescale_normalize(im, 0.00392156862745098, {0.5, 0.5, 0.5},
                                                        {0.5, 0.5, 0.5});
  ASSERT_EQ(px.values.size(), 9u);
  EXPECT_EQ(px.values[0], -1.0f);
  EXPECT_EQ(px.values[2], 1.0f);
  const float v = static_cast<float>(128 * 0.00392156862745098);
  EXPECT_EQ(px.values[1], (v - 0.5f) / 0.5f);
  EXPECT_EQ(px.values[3 + 1], px.values[1]);  // channels first: green's middle pixel
  const auto& g = touchstone::vision::find_processor("gemma3");
  EXPECT_EQ(touchstone::vision::preprocess(noise(50, 30, 1, 5), g).values.size(),
            static_cast<size_t>(3) * 896 * 896);
  EXPECT_THROW(touchstone::vision::find_processor("llava"), touchstone::Error);
}

}  // namespace
