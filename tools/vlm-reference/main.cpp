// touchstone-vlm-reference --mmproj M.gguf --model TEXT.gguf (--in IMAGE.png | --pixels F32)
//                          --ids 1,2,3 (--image-at K | --image-token ID) --out LOGITS.f32
//                          [--layout-out TEXT]
// The reference's multimodal forward pass: the image through the vision tower and
// projector (touchstone/vision/vision_tower.h), the prompt's tokens through the reference
// decoder (touchstone/reference/reference_forward.h) with the image's tokens
// (prefill_embeddings; Gemma 3: attended bidirectionally, Idefics3: causally)
//   --image-at K:      one frame's tokens inserted before ids[K]; the output has
//                      n_ids + n_image_tokens rows;
//   --image-token ID:  the ids hold one run of ID per frame (Idefics3's tiles and global
//                      view, touchstone/vision/image_prompt.h), each run the tower's
//                      tokens per frame long, replaced by the frames' tokens in order
//                      (HF Idefics3Model.inputs_merger); the output has n_ids rows.
// Writes every position's logits, float32 [rows][n_vocab], and prints their shape, the
// frames and the tile grid as JSON; --layout-out writes the text the processor puts in
// place of the prompt's image placeholder. Errors (exit 2) name the file and field: an
// mmproj whose projection width is not the text model's embedding width, an --image-at
// outside the prompt, runs of --image-token that do not match the frames, a bad id.
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
#include "touchstone/vision/image_prompt.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/vision_tower.h"

namespace {

using touchstone::Error;
namespace vision = touchstone::vision;

struct Opts {
  std::string mmproj, model, in, pixels, ids, out, layout_out;
  int image_at = -1, image_token = -1;
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

// The image's frames: --pixels (one, float32 3 x size x size) or --in through the
// tower's own processor (Idefics3: its tiles and global view).
vision::PromptImage image_frames(const Opts& o, const vision::VisionTower& tower) {
  const vision::VisionTowerConfig& c = tower.config;
  if (o.pixels.empty()) return vision::prompt_image(vision::read_png(o.in, true), c, tower.path);
  const std::vector<char> b = read_bytes(o.pixels);
  const size_t n = size_t(3) * size_t(c.image_size) * size_t(c.image_size);
  if (b.size() != n * sizeof(float))
    throw Error("{}: {} bytes; the tower takes 3 x {} x {} float32", o.pixels, b.size(),
                c.image_size, c.image_size);
  vision::PromptImage out;
  out.frames.push_back({3, c.image_size, c.image_size, std::vector<float>(n)});
  std::memcpy(out.frames[0].values.data(), b.data(), b.size());
  out.bidirectional = c.projector == "gemma3";
  return out;
}

// Where each frame's tokens go: --image-at K (one frame, before ids[K]) or the runs of
// --image-token (removed from `ids`, which then holds only text). Returns the positions
// in the text-only ids before which each frame goes.
std::vector<size_t> frame_positions(const Opts& o, std::vector<int32_t>& ids, size_t n_frames,
                                    size_t per_frame) {
  if (o.image_token < 0) {
    if (o.image_at < 0 || size_t(o.image_at) > ids.size())
      throw Error("--image-at {}: expected 0 .. {} (the number of --ids)", o.image_at, ids.size());
    if (n_frames != 1)
      throw Error("--image-at: the image has {} frames; give --image-token", n_frames);
    return {size_t(o.image_at)};
  }
  vision::ImageRuns runs;
  try {
    runs = vision::take_image_runs(ids, o.image_token, per_frame);
  } catch (const Error& e) {
    throw Error("--ids: {}", e.what());
  }
  if (runs.at.size() != n_frames)
    throw Error("--ids: {} runs of --image-token {}; the image has {} frames", runs.at.size(),
                o.image_token, n_frames);
  ids = std::move(runs.text);
  return std::vector<size_t>(runs.at.begin(), runs.at.end());
}

int run(const Opts& o) {
  const vision::VisionTower tower = vision::load_vision_tower(o.mmproj);
  const vision::VisionTowerConfig& c = tower.config;
  std::vector<int32_t> ids = parse_ids(o.ids);
  const touchstone::StoredWeights w = touchstone::load_stored_weights(o.model);
  if (w.config.n_embd != c.n_embd_text)
    throw Error(
        "{}: clip.vision.projection_dim = {} does not match {}'s embedding_length {}: "
        "the mmproj is not this text model's",
        tower.path, c.n_embd_text, o.model, w.config.n_embd);
  const vision::PromptImage im = image_frames(o, tower);
  const size_t m = size_t(c.n_tokens()), V = size_t(w.config.n_vocab);
  const std::vector<size_t> at = frame_positions(o, ids, im.frames.size(), m);
  const int32_t n = int32_t(ids.size() + m * im.frames.size());
  touchstone::ReferenceTransformer ref(w, n, 1);
  std::vector<float> logits(size_t(n) * V);
  size_t done = 0, row = 0;  // text ids consumed, output rows written
  for (size_t f = 0; f <= im.frames.size(); ++f) {
    const size_t until = f < im.frames.size() ? at[f] : ids.size();
    if (until > done)
      ref.prefill(std::span(ids.data() + done, until - done), true,
                  std::span(logits.data() + row * V, (until - done) * V));
    row += until - done;
    done = until;
    if (f == im.frames.size()) break;
    const std::vector<float> tokens =
        vision::project(tower, vision::encode_patches(tower, im.frames[f]));
    ref.prefill_embeddings(tokens, int32_t(m), im.bidirectional, true,
                           std::span(logits.data() + row * V, m * V));
    row += m;
  }
  std::ofstream f(o.out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
  if (!f) throw Error("{}: write failed", o.out);
  if (!o.layout_out.empty()) {
    std::ofstream l(o.layout_out, std::ios::binary);
    l << im.layout;
    if (!l) throw Error("{}: write failed", o.layout_out);
  }
  fmt::print(
      "{{\"shape\": [{}, {}], \"dtype\": \"float32\", \"frames\": {}, \"grid\": [{}, {}], "
      "\"image_positions\": [{}, {}]}}\n",
      n, V, im.frames.size(), im.rows, im.cols, at[0], at[0] + m);
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
  auto* image_at = app.add_option("--image-at", o.image_at, "one frame's tokens go before ids[N]");
  auto* image_token =
      app.add_option("--image-token", o.image_token, "the ids' runs of this id are the frames");
  image_at->excludes(image_token);
  app.add_option("--layout-out", o.layout_out, "write the processor's text for the image");
  app.add_option("--out", o.out, "float32 logits [positions][n_vocab]")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.in.empty() == o.pixels.empty()) throw Error("give one of --in or --pixels");
    if ((o.image_at < 0) == (o.image_token < 0))
      throw Error("give one of --image-at or --image-token");
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "touchstone-vlm-reference: error: %s\n", e.what());
    return 2;
  }
}
