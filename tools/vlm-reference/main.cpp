// touchstone-vlm-reference --mmproj M.gguf --model TEXT.gguf (--in IMAGE.png | --pixels F32)
//                          --ids 1,2,3 --image-at K --out LOGITS.f32
// The reference's multimodal forward pass: the image through the vision tower and
// projector (touchstone/vision/vision_tower.h), the prompt's tokens through the reference
// decoder (touchstone/reference/reference_forward.h) with the image's tokens inserted
// before ids[K] (prefill_embeddings; Gemma 3: attended bidirectionally). Writes every
// position's logits, float32 [n_ids + n_image_tokens][n_vocab], and prints their shape
// as JSON. Errors (exit 2) name the file and field: an mmproj whose projection width is
// not the text model's embedding width, an --image-at outside the prompt, a bad id.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/reference_forward.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/vision_tower.h"

namespace {

using touchstone::Error;
namespace vision = touchstone::vision;

struct Opts {
  std::string mmproj, model, in, pixels, ids, out;
  int image_at = -1;
};

// "1,2,3" -> {1, 2, 3}.
std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = s.find(',', i);
    const std::string item = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    size_t used = 0;
    try {
      ids.push_back(int32_t(std::stoi(item, &used)));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) throw Error("--ids: '{}' is not a token id", item);
    i = j == std::string::npos ? s.size() : j + 1;
  }
  return ids;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("{}: cannot open", path);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The image's tokens: --pixels (float32 3 x size x size) or --in through the tower's
// own processor.
std::vector<float> image_tokens(const Opts& o, const vision::VisionTower& tower) {
  const vision::VisionTowerConfig& c = tower.config;
  vision::PixelValues px;
  if (!o.pixels.empty()) {
    const std::vector<char> b = read_bytes(o.pixels);
    const size_t n = size_t(3) * size_t(c.image_size) * size_t(c.image_size);
    if (b.size() != n * sizeof(float))
      throw Error("{}: {} bytes; the tower takes 3 x {} x {} float32", o.pixels, b.size(),
                  c.image_size, c.image_size);
    px = {3, c.image_size, c.image_size, std::vector<float>(n)};
    std::memcpy(px.values.data(), b.data(), b.size());
  } else {
    px = vision::preprocess(vision::read_png(o.in, true), vision::processor_of(tower));
  }
  return vision::project(tower, vision::encode_patches(tower, px));
}

int run(const Opts& o) {
  const vision::VisionTower tower = vision::load_vision_tower(o.mmproj);
  const vision::VisionTowerConfig& c = tower.config;
  const std::vector<int32_t> ids = parse_ids(o.ids);
  if (o.image_at < 0 || size_t(o.image_at) > ids.size())
    throw Error("--image-at {}: expected 0 .. {} (the number of --ids)", o.image_at, ids.size());
  const touchstone::StoredWeights w = touchstone::load_stored_weights(o.model);
  if (w.config.n_embd != c.n_embd_text)
    throw Error(
        "{}: clip.vision.projection_dim = {} does not match {}'s embedding_length {}: "
        "the mmproj is not this text model's",
        tower.path, c.n_embd_text, o.model, w.config.n_embd);
  const std::vector<float> image = image_tokens(o, tower);
  const size_t at = size_t(o.image_at), V = size_t(w.config.n_vocab), m = size_t(c.n_tokens());
  const int32_t n = int32_t(ids.size() + m);
  touchstone::ReferenceTransformer ref(w, n, 1);
  std::vector<float> logits(size_t(n) * V);
  float* row = logits.data();
  if (at > 0) ref.prefill(std::span(ids.data(), at), true, std::span(row, at * V));
  ref.prefill_embeddings(image, int32_t(m), c.projector == "gemma3", true,
                         std::span(row + at * V, m * V));
  if (at < ids.size())
    ref.prefill(std::span(ids.data() + at, ids.size() - at), true,
                std::span(row + (at + m) * V, (ids.size() - at) * V));
  std::ofstream f(o.out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
  if (!f) throw Error("{}: write failed", o.out);
  fmt::print("{{\"shape\": [{}, {}], \"dtype\": \"float32\", \"image_positions\": [{}, {}]}}\n", n,
             V, at, at + m);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The reference's multimodal forward pass: every position's logits"};
  Opts o;
  app.add_option("--mmproj", o.mmproj, "mmproj GGUF (vision tower and projector)")->required();
  app.add_option("--model", o.model, "the text model's GGUF")->required();
  auto* in = app.add_option("--in", o.in, "PNG image (the tower's own processor)");
  auto* px = app.add_option("--pixels", o.pixels, "float32 pixel values, 3 x size x size");
  in->excludes(px);
  app.add_option("--ids", o.ids, "the prompt's token ids, comma-separated")->required();
  app.add_option("--image-at", o.image_at, "the image's tokens go before ids[N]")->required();
  app.add_option("--out", o.out, "float32 logits [positions][n_vocab]")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.in.empty() == o.pixels.empty()) throw Error("give one of --in or --pixels");
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "touchstone-vlm-reference: error: %s\n", e.what());
    return 2;
  }
}
