// case_image.cpp - see touchstone/harness/case_image.h.
#include "touchstone/harness/case_image.h"

#include <fstream>
#include <iterator>

#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/vision_tower.h"

namespace touchstone {
namespace {

// The file's bytes' sha256, checked against the manifest's pin.
std::string pinned_sha256(const std::string& path, const std::string& want,
                          const std::string& case_name) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("case '{}': cannot open {}", case_name, path);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string got = sha256_hex(bytes);
  if (got != want)
    throw Error("case '{}': {} has sha256 {}, the manifest pins {}", case_name, path, got, want);
  return got;
}

}  // namespace

std::pair<std::string, std::string> split_at_image(const std::string& prompt,
                                                   const std::string& case_name) {
  const size_t at = prompt.find(kImagePlaceholder);
  if (at == std::string::npos || prompt.find(kImagePlaceholder, at + 1) != std::string::npos)
    throw Error("case '{}': the prompt must hold \"{}\" exactly once", case_name,
                kImagePlaceholder);
  return {prompt.substr(0, at), prompt.substr(at + kImagePlaceholder.size())};
}

CaseImage prepare_case_image(const Manifest& manifest, const ManifestCase& c, BackendModel& model) {
  const std::string png = manifest.resolve(c.image.file);
  const std::string mmproj = manifest.resolve(c.image.mmproj);
  CaseImage out;
  out.image_sha256 = pinned_sha256(png, c.image.sha256, c.name);
  out.mmproj_sha256 = pinned_sha256(mmproj, c.image.mmproj_sha256, c.name);
  const vision::VisionTower tower = vision::load_vision_tower(mmproj);
  if (tower.config.projector != "gemma3")
    throw Error(
        "case '{}': {}: projector '{}': Touchstone judges the decoder with Gemma 3's "
        "image block only (Idefics3's tiles and their prompt layout are not judged yet)",
        c.name, mmproj, tower.config.projector);
  const vision::PixelValues px =
      vision::preprocess(vision::read_png(png, true), vision::processor_of(tower));
  out.pixels_sha256 = sha256_hex(std::string_view(reinterpret_cast<const char*>(px.values.data()),
                                                  px.values.size() * sizeof(float)));
  out.n_tokens = tower.config.n_tokens();
  out.dim = tower.config.n_embd_text;
  out.bidirectional = true;  // Gemma 3: HF's token_type_ids mask, llama.cpp's non-causal ubatch
  if (!model.library()->has_vision())
    throw Error(
        "case '{}': the recording backend '{}' has no vision tower (ABI v8 "
        "TS_CAP_MULTIMODAL)",
        c.name, model.library()->name());
  model.load_vision(mmproj);
  out.embeddings =
      model.encode_image(px.values, px.height, px.width, size_t(out.n_tokens) * size_t(out.dim));
  return out;
}

}  // namespace touchstone
