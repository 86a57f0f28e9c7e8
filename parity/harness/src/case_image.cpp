// case_image.cpp - see touchstone/harness/case_image.h.
#include "touchstone/harness/case_image.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"
#include "touchstone/vision/image.h"
#include "touchstone/vision/image_prompt.h"
#include "touchstone/vision/preprocess.h"
#include "touchstone/vision/resample.h"
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

namespace {

// The case's pixels as the mmproj's processor makes them, with the files' digests.
struct CasePixels {
  std::string mmproj, image_sha256, mmproj_sha256;
  vision::VisionTowerConfig tower;
  vision::Image rgb;          // the decoded image, alpha composited over white (convert_to_rgb)
  vision::PromptImage image;  // the frames, the grid and the prompt text
};

CasePixels case_pixels(const Manifest& manifest, const ManifestCase& c) {
  CasePixels out;
  const std::string png = manifest.resolve(c.image.file);
  out.mmproj = manifest.resolve(c.image.mmproj);
  out.image_sha256 = pinned_sha256(png, c.image.sha256, c.name);
  out.mmproj_sha256 = pinned_sha256(out.mmproj, c.image.mmproj_sha256, c.name);
  out.tower = vision::read_vision_config(out.mmproj);  // the keys only: the backend has the tower
  const vision::Image image = vision::read_png(png, true);
  out.rgb = vision::convert_to_rgb(image);
  out.image = vision::prompt_image(image, out.tower, out.mmproj);
  return out;
}

// The backend's tower (attached once per mmproj) on the harness's pixel tensor, or, where
// it takes only a decoded image (TS_ERR_UNSUPPORTED: an engine that preprocesses
// itself), on the decoded RGB image; *by_backend says which.
std::vector<float> encode(BackendModel& model, const CasePixels& p, const std::string& name,
                          bool* by_backend = nullptr) {
  if (!model.library()->has_vision())
    throw Error("case '{}': backend '{}' has no vision tower (ABI v8 TS_CAP_MULTIMODAL)", name,
                model.library()->name());
  model.load_vision(p.mmproj);
  const size_t n = size_t(p.tower.n_tokens()) * size_t(p.tower.n_embd_text);
  if (by_backend) *by_backend = false;
  try {
    std::vector<float> out;
    for (const vision::PixelValues& px : p.image.frames) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(px.values.data());
      const std::vector<float> e = model.encode_image(
          TS_IMAGE_PIXELS_F32, std::span(bytes, px.values.size() * sizeof(float)), px.height,
          px.width, n);
      out.insert(out.end(), e.begin(), e.end());
    }
    return out;
  } catch (const BackendError& e) {
    if (e.status() != TS_ERR_UNSUPPORTED || !by_backend) throw;
  }
  // An engine that preprocesses itself returns every frame's tokens for the image.
  *by_backend = true;
  return model.encode_image(TS_IMAGE_RGB8, p.rgb.pixels, p.rgb.height, p.rgb.width,
                            n * p.image.frames.size());
}

}  // namespace

CaseImage prepare_case_image(const Manifest& manifest, const ManifestCase& c, BackendModel& model) {
  const CasePixels p = case_pixels(manifest, c);
  CaseImage out;
  out.image_sha256 = p.image_sha256;
  out.mmproj_sha256 = p.mmproj_sha256;
  std::string px;  // every frame's pixel values, float32, in order
  for (const vision::PixelValues& f : p.image.frames)
    px.append(reinterpret_cast<const char*>(f.values.data()), f.values.size() * sizeof(float));
  out.pixels_sha256 = sha256_hex(px);
  out.n_frames = int32_t(p.image.frames.size());
  out.n_tokens = p.tower.n_tokens() * out.n_frames;
  out.dim = p.tower.n_embd_text;
  // Gemma 3: HF's token_type_ids mask, llama.cpp's non-causal ubatch; Idefics3: causal.
  out.bidirectional = p.image.bidirectional;
  out.layout = p.image.layout;
  out.embeddings = encode(model, p, c.name);
  return out;
}

namespace {

// NMSE, max |diff| and max |diff| in 8-bit levels of `got` (every frame, in order)
// against the frames; the frames' shape is got's.
void compare_pixels(const std::vector<vision::PixelValues>& frames, const std::vector<float>& got,
                    const std::array<double, 3>& std, PreprocessCheck& r) {
  double num = 0.0, den = 0.0;
  r.max_abs = r.max_levels = 0.0;
  size_t i = 0;
  for (const vision::PixelValues& f : frames) {
    const size_t plane = size_t(f.height) * size_t(f.width);
    for (size_t k = 0; k < f.values.size(); ++k, ++i) {
      const double want = f.values[k], e = double{got[i]} - want;
      const double level = (1.0 / 255.0) / std[k / plane];
      num += e * e;
      den += want * want;
      const double a = std::isnan(e) ? INFINITY : std::fabs(e);
      r.max_abs = std::max(r.max_abs, a);
      r.max_levels = std::max(r.max_levels, a / level);
    }
  }
  r.nmse = den > 0.0 ? num / den : (num > 0.0 ? INFINITY : 0.0);
  if (std::isnan(r.nmse)) r.nmse = INFINITY;
}

// Where the first non-finite value of `got` sits (frames of 3 x h x w), "" = none.
std::string first_non_finite(const std::vector<float>& got, int32_t h, int32_t w) {
  const auto it = std::find_if(got.begin(), got.end(), [](float v) { return !std::isfinite(v); });
  if (it == got.end()) return "";
  const size_t i = size_t(it - got.begin()), plane = size_t(h) * size_t(w);
  return fmt::format("frame {}, channel {}, y {}, x {}", i / (3 * plane), i / plane % 3,
                     i % plane / size_t(w), i % size_t(w));
}

}  // namespace

PreprocessCheck check_case_preprocess(const Manifest& manifest, const ManifestCase& c,
                                      BackendModel& model) {
  const CasePixels p = case_pixels(manifest, c);
  model.load_vision(p.mmproj);
  const PixelTensor t = model.preprocess_image(p.rgb.pixels, p.rgb.height, p.rgb.width);
  PreprocessCheck r;
  r.n_frames = t.n_frames;
  r.height = t.height;
  r.width = t.width;
  r.want_frames = int32_t(p.image.frames.size());
  r.want_height = p.image.frames.at(0).height;
  r.want_width = p.image.frames.at(0).width;
  if (!r.same_shape()) return r;
  compare_pixels(p.image.frames, t.values, p.tower.std, r);
  if (r.passed()) return r;
  r.non_finite = first_non_finite(t.values, t.height, t.width);
  if (!r.non_finite.empty()) return r;
  // Why: the processor again with each of Pillow's filters in place of its own.
  for (const vision::Filter f :
       {vision::Filter::Box, vision::Filter::Bilinear, vision::Filter::Hamming,
        vision::Filter::Bicubic, vision::Filter::Lanczos}) {
    const vision::PromptImage other = vision::prompt_image(p.rgb, p.tower, p.mmproj, f);
    if (other.frames.size() != p.image.frames.size()) continue;
    PreprocessCheck o = r;
    compare_pixels(other.frames, t.values, p.tower.std, o);
    if (o.passed()) {
      r.matching_filter = vision::filter_name(f);
      break;
    }
  }
  return r;
}

EncoderCheck check_case_encoder(const Manifest& manifest, const ManifestCase& c,
                                const std::vector<float>& golden, BackendModel& model) {
  EncoderCheck r;
  r.embeddings = encode(model, case_pixels(manifest, c), c.name, &r.preprocessed_by_backend);
  if (r.embeddings.size() != golden.size())
    throw Error("case '{}': the backend's tower gives {} values, the golden holds {}", c.name,
                r.embeddings.size(), golden.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < golden.size(); ++i) {
    const double e = double{r.embeddings[i]} - double{golden[i]};
    num += e * e;
    den += double{golden[i]} * double{golden[i]};
    r.max_abs = std::max(r.max_abs, std::isnan(e) ? INFINITY : std::fabs(e));
  }
  r.nmse = den > 0.0 ? num / den : (num > 0.0 ? INFINITY : 0.0);
  if (std::isnan(r.nmse)) r.nmse = INFINITY;
  return r;
}

}  // namespace touchstone
