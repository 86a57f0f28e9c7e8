// touchstone image (--in IMAGE.png | --pixels F32) (--resize WxH [--filter F] |
//                  --processor NAME | --mmproj FILE [--stage S]) --out FILE
// An image as a vision-language model's processor prepares it (model/vision,
// docs/vision.md): --resize writes the resized PNG (Pillow's Image.resize bit for
// bit); --processor writes the pixel values, float32 little-endian, channels x height
// x width, and prints their shape as JSON. --mmproj runs the reference's vision tower
// of an mmproj GGUF (its own processor unless --processor names one) and writes
// --stage pixels (C x H x W), patches (the encoder's output, n_patches x n_embd) or
// embeddings (the projector's, n_tokens x n_embd_text; the default), float32; --pixels
// gives it pixel values instead of an image (a processor the reference lacks: Idefics3's
// image splitting).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/image_prompt.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/resample.h"
#include "touchstone/vision/vision_tower.h"

namespace touchstone::cli {
namespace {

struct ImageOpts {
  std::string in, pixels, out, resize, filter = "bicubic", processor, mmproj, stage = "embeddings";
  int longest_edge = 0;
};

void write_f32(const std::string& path, const std::vector<float>& v) {
  const auto* bytes = reinterpret_cast<const char*>(v.data());
  fileio::write_atomic(path, std::string_view(bytes, v.size() * sizeof(float)));
}

// --pixels: float32 little-endian, 3 x image_size x image_size (channels first).
vision::PixelValues read_pixels(const std::string& path, const vision::VisionTowerConfig& c) {
  const std::string bytes = fileio::read_file(path, "pixel values");
  const size_t n = size_t(3) * size_t(c.image_size) * size_t(c.image_size);
  if (bytes.size() != n * sizeof(float))
    throw Error("{}: {} bytes of pixel values; the tower takes 3 x {} x {} float32 ({} bytes)",
                path, bytes.size(), c.image_size, c.image_size, n * sizeof(float));
  vision::PixelValues px{3, c.image_size, c.image_size, std::vector<float>(n)};
  std::memcpy(px.values.data(), bytes.data(), bytes.size());
  return px;
}

// The frames the tower runs on: --pixels (one), Idefics3's tiles plus its global view
// (image_splitting.h; --longest-edge, default the mmproj's or 4 tiles), or the tower's own
// processor's one (or --processor's).
std::vector<vision::PixelValues> frames_of(const ImageOpts& o, const vision::VisionTower& tower) {
  const vision::VisionTowerConfig& c = tower.config;
  if (!o.pixels.empty()) return {read_pixels(o.pixels, c)};
  const vision::Image im = vision::read_png(o.in, true);
  if (c.projector == "idefics3" && o.processor.empty()) {
    return vision::split_image(im, vision::splitting_processor_of(c, o.longest_edge));
  }
  return {vision::preprocess(
      im, o.processor.empty() ? vision::processor_of(tower) : vision::find_processor(o.processor))};
}

// --mmproj: the reference's vision tower up to --stage, on an image (--in) or on given
// pixel values (--pixels); every frame's output, frame after frame.
int run_tower(const ImageOpts& o) {
  const vision::VisionTower tower = vision::load_vision_tower(o.mmproj);
  const vision::VisionTowerConfig& c = tower.config;
  const std::vector<vision::PixelValues> frames = frames_of(o, tower);
  const size_t n = frames.size();
  std::vector<float> out;
  for (const vision::PixelValues& px : frames) {
    if (o.stage == "pixels") {
      out.insert(out.end(), px.values.begin(), px.values.end());
      continue;
    }
    const std::vector<float> patches = vision::encode_patches(tower, px);
    const std::vector<float> v =
        o.stage == "embeddings" ? vision::project(tower, patches) : patches;
    out.insert(out.end(), v.begin(), v.end());
  }
  write_f32(o.out, out);
  if (o.stage == "pixels") {
    fmt::print("{{\"shape\": [{}, 3, {}, {}], \"dtype\": \"float32\", \"layout\": \"NCHW\"}}\n", n,
               c.image_size, c.image_size);
  } else {
    const bool emb = o.stage == "embeddings";
    fmt::print(
        "{{\"shape\": [{}, {}], \"dtype\": \"float32\", \"stage\": \"{}\", \"frames\": {}}}\n",
        n * size_t(emb ? c.n_tokens() : c.n_patches()), emb ? c.n_embd_text : c.n_embd, o.stage, n);
  }
  return 0;
}

std::pair<int, int> parse_size(const std::string& s) {
  int w = 0, h = 0;
  char x = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || x != 'x' || w < 1 || h < 1)
    throw Error("--resize {}: expected WIDTHxHEIGHT, both >= 1 (e.g. 896x896)", s);
  return {w, h};
}

int run_image(const ImageOpts& o) {
  if (!o.mmproj.empty()) return run_tower(o);
  // --resize: PIL's convert("L" / "RGB") (alpha dropped); a processor: its convert_to_rgb
  // (alpha composited over white), so the alpha channel is read.
  const vision::Image im = vision::read_png(o.in, o.resize.empty());
  if (!o.resize.empty()) {
    const auto [w, h] = parse_size(o.resize);
    vision::write_png(o.out, vision::resize(im, w, h, vision::parse_filter(o.filter)));
    return 0;
  }
  const vision::PixelValues px = vision::preprocess(im, vision::find_processor(o.processor));
  const auto* bytes = reinterpret_cast<const char*>(px.values.data());
  fileio::write_atomic(o.out, std::string_view(bytes, px.values.size() * sizeof(float)));
  fmt::print("{{\"shape\": [{}, {}, {}], \"dtype\": \"float32\", \"layout\": \"CHW\"}}\n",
             px.channels, px.height, px.width);
  return 0;
}

}  // namespace

void add_image(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ImageOpts>();
  CLI::App* cmd = app.add_subcommand("image",
                                     "An image resized, or preprocessed into pixel values, as a "
                                     "vision-language model's processor does it");
  auto* in = cmd->add_option("--in", o->in, "PNG image");
  auto* px =
      cmd->add_option("--pixels", o->pixels,
                      "With --mmproj, instead of --in: float32 pixel values, 3 x size x size");
  cmd->add_option("--out", o->out, "Output: a PNG (--resize) or float32 pixel values (--processor)")
      ->required();
  auto* r = cmd->add_option("--resize", o->resize, "WIDTHxHEIGHT: resize as Pillow does");
  cmd->add_option("--filter", o->filter, "box, bilinear, hamming, bicubic (default) or lanczos");
  auto* p = cmd->add_option("--processor", o->processor, "A processor's whole pipeline (gemma3)");
  auto* m = cmd->add_option("--mmproj", o->mmproj,
                            "An mmproj GGUF: run its vision tower (the reference's)");
  cmd->add_option("--stage", o->stage, "With --mmproj: pixels, patches or embeddings (default)")
      ->check(CLI::IsMember({"pixels", "patches", "embeddings"}));
  cmd->add_option("--longest-edge", o->longest_edge,
                  "With an Idefics3 mmproj: size[\"longest_edge\"] (default: its "
                  "clip.vision.preproc_image_size, else 4 x the tile size)");
  r->excludes(p);
  r->excludes(m);
  px->excludes(in);
  px->needs(m);
  cmd->callback([o, &exit_code] {
    if (o->resize.empty() == (o->processor.empty() && o->mmproj.empty()))
      throw Error("touchstone image: give one of --resize, --processor or --mmproj");
    if (o->in.empty() == o->pixels.empty())
      throw Error("touchstone image: give one of --in or --pixels (with --mmproj)");
    exit_code = run_image(*o);
  });
}

}  // namespace touchstone::cli
