// touchstone image --in IMAGE.png (--resize WxH [--filter F] | --processor NAME) --out FILE
// An image as a vision-language model's processor prepares it (model/vision,
// docs/vision.md), without running a model: --resize writes the resized PNG
// (Pillow's Image.resize bit for bit); --processor writes the pixel values,
// float32 little-endian, channels x height x width, and prints their shape as JSON.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/resample.h"

namespace touchstone::cli {
namespace {

struct ImageOpts {
  std::string in, out, resize, filter = "bicubic", processor;
};

std::pair<int, int> parse_size(const std::string& s) {
  int w = 0, h = 0;
  char x = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || x != 'x' || w < 1 || h < 1)
    throw Error("--resize {}: expected WIDTHxHEIGHT, both >= 1 (e.g. 896x896)", s);
  return {w, h};
}

int run_image(const ImageOpts& o) {
  const vision::Image im = vision::read_png(o.in);
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
  cmd->add_option("--in", o->in, "PNG image")->required();
  cmd->add_option("--out", o->out, "Output: a PNG (--resize) or float32 pixel values (--processor)")
      ->required();
  auto* r = cmd->add_option("--resize", o->resize, "WIDTHxHEIGHT: resize as Pillow does");
  cmd->add_option("--filter", o->filter, "box, bilinear, hamming, bicubic (default) or lanczos");
  auto* p = cmd->add_option("--processor", o->processor, "A processor's whole pipeline (gemma3)");
  r->excludes(p);
  cmd->callback([o, &exit_code] {
    if (o->resize.empty() == o->processor.empty())
      throw Error("touchstone image: give one of --resize or --processor");
    exit_code = run_image(*o);
  });
}

}  // namespace touchstone::cli
