// vision_tower_test.cpp - the reference's vision tower (touchstone/vision/vision_tower.h)
// on the committed tiny mmproj (tests/models/vision), HF's convert_to_rgb, and the errors
// an mmproj that is not one gets. Agreement with HF transformers itself is
// ci/validate_vision.py's (docs/validation.md, "Vision tower").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gguf_builder.h"
#include "touchstone/common/error.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/image_splitting.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/vision_tower.h"

namespace {

namespace v = touchstone::vision;
namespace gg = touchstone::gguf;

const std::string kDir = TOUCHSTONE_VISION_MODEL_DIR;
const std::string kMmproj = kDir + "/mmproj-gemma3vl-test-f32.gguf";

// A deterministic RGB image of w x h with a gradient plus a pattern that `seed` moves.
v::Image test_image(int w, int h, int seed) {
  v::Image im{w, h, 3, {}};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        im.pixels.push_back(uint8_t((x * 7 + y * 3 + c * 50 + seed * ((x ^ y) & 15)) % 256));
  return im;
}

// The message of the touchstone::Error that f throws ("" when none).
template <typename F>
std::string error_of(const F& f) {
  try {
    f();
  } catch (const touchstone::Error& e) {
    return e.what();
  }
  return "";
}

TEST(VisionTower, ReadsTheMmprojKeys) {
  const v::VisionTower t = v::load_vision_tower(kMmproj);
  const v::VisionTowerConfig& c = t.config;
  EXPECT_EQ(c.projector, "gemma3");
  EXPECT_EQ(c.image_size, 64);
  EXPECT_EQ(c.patch_size, 8);
  EXPECT_EQ(c.n_embd, 32);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.n_embd_text, 64);
  EXPECT_EQ(c.pool, 2);
  EXPECT_EQ(c.n_patches(), 64);
  EXPECT_EQ(c.n_tokens(), 16);
  const v::ImageProcessor p = v::processor_of(t);
  EXPECT_EQ(p.width, 64);
  EXPECT_EQ(p.resample, v::Filter::Bilinear);
  EXPECT_EQ(p.mean[0], 0.5);
}

// Shapes, finite values; every image token depends on the image (a different image
// changes every row), and the rows differ from each other.
TEST(VisionTower, EncodesAndProjectsAnImage) {
  const v::VisionTower t = v::load_vision_tower(kMmproj);
  const v::ImageProcessor p = v::processor_of(t);
  const std::vector<float> a =
      v::project(t, v::encode_patches(t, v::preprocess(test_image(90, 70, 1), p)));
  const std::vector<float> b =
      v::project(t, v::encode_patches(t, v::preprocess(test_image(90, 70, 2), p)));
  ASSERT_EQ(a.size(), 16u * 64u);
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float x) { return std::isfinite(x); }));
  for (size_t r = 0; r < 16; ++r) {
    const auto row = [&](const std::vector<float>& e, size_t i) {
      return std::vector<float>(e.begin() + long(i * 64), e.begin() + long((i + 1) * 64));
    };
    EXPECT_NE(row(a, r), row(b, r)) << "token " << r;
    if (r > 0) {
      EXPECT_NE(row(a, r), row(a, r - 1)) << "token " << r;
    }
  }
  EXPECT_THROW(
      v::encode_patches(t, v::preprocess(test_image(90, 70, 1), v::find_processor("gemma3"))),
      touchstone::Error);  // 896 x 896 pixels for a 64 x 64 tower
}

// Idefics3 (SmolVLM): the pixel-shuffle connector. Moving one patch's pixels changes
// exactly the image token whose 2 x 2 window holds that patch (the tower mixes patches,
// so every patch output moves; the connector then groups them: checked on the patch
// outputs directly). processor_of points to split_image for it.
TEST(VisionTower, Idefics3PixelShuffleGroupsTwoByTwoPatches) {
  const v::VisionTower t = v::load_vision_tower(kDir + "/mmproj-idefics3vl-test-f32.gguf");
  const v::VisionTowerConfig& c = t.config;
  EXPECT_EQ(c.projector, "idefics3");
  EXPECT_EQ(c.pool, 2);
  EXPECT_EQ(c.n_tokens(), 16);
  std::vector<float> patches(size_t(c.n_patches()) * size_t(c.n_embd), 0.0f);
  const std::vector<float> base = v::project(t, patches);
  ASSERT_EQ(base.size(), 16u * 64u);
  // Patch (row 5, column 2) of the 8 x 8 grid: token (2, 1) of the 4 x 4 grid.
  for (int e = 0; e < c.n_embd; ++e) patches[size_t((5 * 8 + 2) * c.n_embd + e)] = 1.0f;
  const std::vector<float> moved = v::project(t, patches);
  for (size_t tok = 0; tok < 16; ++tok) {
    const bool same = std::equal(base.begin() + long(tok * 64), base.begin() + long((tok + 1) * 64),
                                 moved.begin() + long(tok * 64));
    EXPECT_EQ(same, tok != 2 * 4 + 1) << "token " << tok;
  }
  const std::string msg = error_of([&] { v::processor_of(t); });
  EXPECT_NE(msg.find("split_image"), std::string::npos) << msg;
}

TEST(VisionTower, ATextModelIsNotAnMmproj) {
  const std::string text = kDir + "/gemma3vl-test-f32.gguf";
  const std::string msg = error_of([&] { v::load_vision_tower(text); });
  EXPECT_NE(msg.find(text), std::string::npos) << msg;
  EXPECT_NE(msg.find("general.architecture = 'gemma3'"), std::string::npos) << msg;
}

// A clip file with the keys of the test mmproj but another projector, or no tensors.
std::vector<uint8_t> clip_file(const std::string& projector) {
  using gg::ValueType;
  gg::testing::GgufBuilder g;
  g.key("general.architecture", ValueType::STRING).str("clip");
  g.key("clip.projector_type", ValueType::STRING).str(projector);
  for (const auto& [k, val] :
       {std::pair{"image_size", 64}, std::pair{"patch_size", 8}, std::pair{"embedding_length", 32},
        std::pair{"feed_forward_length", 64}, std::pair{"block_count", 1},
        std::pair{"attention.head_count", 2}, std::pair{"projection_dim", 64}})
    g.key(std::string("clip.vision.") + k, ValueType::UINT32).put<uint32_t>(uint32_t(val));
  g.key("clip.vision.attention.layer_norm_epsilon", ValueType::FLOAT32).put<float>(1e-6f);
  for (const char* k : {"clip.vision.image_mean", "clip.vision.image_std"}) {
    g.key(k, ValueType::ARRAY).put<uint32_t>(uint32_t(ValueType::FLOAT32)).put<uint64_t>(3);
    for (int i = 0; i < 3; ++i) g.kv.put<float>(0.5f);
  }
  return g.build();
}

TEST(VisionTower, AnotherProjectorOrAMissingTensorIsNamed) {
  gg::testing::TempFile other(clip_file("llava"), "mmproj_other");
  std::string msg = error_of([&] { v::load_vision_tower(other.path()); });
  EXPECT_NE(msg.find("clip.projector_type = 'llava'"), std::string::npos) << msg;
  gg::testing::TempFile empty(clip_file("gemma3"), "mmproj_empty");
  msg = error_of([&] { v::load_vision_tower(empty.path()); });
  EXPECT_NE(msg.find(empty.path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("v.patch_embd.weight"), std::string::npos) << msg;
}

// transformers' convert_to_rgb: opaque pixels keep their colour (gray replicated),
// transparent ones become white, and a partly transparent one lies between its colour
// and white.
TEST(ConvertToRgb, CompositesOverWhiteAsTheHfProcessorsDo) {
  v::Image rgba{256, 4, 4, {}};
  for (int a : {255, 0, 128, 1})
    for (int x = 0; x < 256; ++x)
      rgba.pixels.insert(rgba.pixels.end(), {uint8_t(x), 0, 255, uint8_t(a)});
  const v::Image rgb = v::convert_to_rgb(rgba);
  ASSERT_EQ(rgb.channels, 3);
  for (int x = 0; x < 256; ++x) {
    EXPECT_EQ(rgb.at(0, x, 0), x);  // alpha 255
    EXPECT_EQ(rgb.at(0, x, 1), 0);
    EXPECT_EQ(rgb.at(1, x, 0), 255);  // alpha 0
    EXPECT_EQ(rgb.at(1, x, 1), 255);
    EXPECT_GE(rgb.at(2, x, 0), x);  // alpha 128: between the colour and white
    EXPECT_GT(rgb.at(2, x, 1), 0);
    EXPECT_LT(rgb.at(2, x, 1), 255);
    EXPECT_GE(rgb.at(3, x, 0), 254);  // alpha 1: almost white
  }
  v::Image la{2, 1, 2, {40, 255, 40, 0}};
  const v::Image g = v::convert_to_rgb(la);
  EXPECT_EQ(std::vector<uint8_t>(g.pixels.begin(), g.pixels.end()),
            (std::vector<uint8_t>{40, 40, 40, 255, 255, 255}));
}

}  // namespace

namespace {

// Idefics3's image splitting (image_splitting.h): the frame count follows the sizes the
// HF processor computes; a constant image gives constant frames; a tile-sized budget
// gives one frame. Bit equality with HF's processor is ci/validate_vision.py's.
TEST(SplitImage, FramesFollowTheProcessorsSizes) {
  v::SplittingProcessor p;
  p.tile = 64;
  p.longest_edge = 256;
  // 451 x 300 -> 256 x 170 (int(256 / 1.503...) = 170, even) -> 256 x 192 (ceil(170/64)=3
  // tiles high): 4 x 3 tiles + the global view.
  EXPECT_EQ(v::split_image(test_image(451, 300, 1), p).size(), 13u);
  // 300 x 7 -> 256 x 5 + 1 = 6 -> 256 x 64: 4 x 1 tiles + the global view.
  EXPECT_EQ(v::split_image(test_image(300, 7, 1), p).size(), 5u);
  // 7 x 300 (tall): 1 x 4 tiles + the global view.
  EXPECT_EQ(v::split_image(test_image(7, 300, 1), p).size(), 5u);
  p.longest_edge = 64;  // fits one tile: the resized image alone
  const std::vector<v::PixelValues> one = v::split_image(test_image(90, 70, 1), p);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].width, 64);
  v::Image flat{40, 30, 3, std::vector<uint8_t>(40 * 30 * 3, 200)};
  p.longest_edge = 256;
  for (const v::PixelValues& f : v::split_image(flat, p))
    for (float x : f.values) EXPECT_EQ(x, f.values[0]);
  p.tile = 0;
  EXPECT_THROW(v::split_image(flat, p), touchstone::Error);
}

}  // namespace
