// touchstone/harness/case_image.h - a golden case's image as the decoder takes it
// (docs/vision.md): the PNG through the mmproj's own processor, then the recording
// backend's vision tower and projector (ABI v8 load_vision + encode_image).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "touchstone/golden/manifest.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

struct CaseImage {
  std::vector<float> embeddings;  // [n_tokens, dim] float32, the frames' tokens in order
  int32_t n_tokens = 0, dim = 0;  // n_tokens: every frame's
  int32_t n_frames = 1;           // Idefics3: its tiles and the global view
  bool bidirectional = false;     // the family attends the image block both ways (Gemma 3)
  // Idefics3: the processor's text in place of the prompt's placeholder, with one run of
  // "<image>" per frame (touchstone/vision/image_prompt.h); empty: the one frame goes
  // where the placeholder is (Gemma 3).
  std::string layout;
  std::string image_sha256, pixels_sha256, mmproj_sha256;
};

// Reads the case's PNG and mmproj (each checked against the manifest's sha256, an
// Error naming the file and both digests otherwise), preprocesses the image with the
// processor the mmproj describes, attaches the tower to `model` and encodes the image.
// Idefics3's frames are encoded one by one (each a tower-sized pixel tensor). Throws the
// backend's errors as they come.
CaseImage prepare_case_image(const Manifest& manifest, const ManifestCase& c, BackendModel& model);

// multimodal.encoder: the backend's own vision tower (ABI v8 TS_CAP_MULTIMODAL) on the
// case's image against the golden's embeddings (the reference's tower): the harness's
// pixel tensor, or the decoded image where the backend preprocesses itself. nmse / max_abs
// over every value; embeddings: the backend's, for the decoder run that follows.
struct EncoderCheck {
  double nmse = 0.0, max_abs = 0.0;
  std::vector<float> embeddings;
  // The backend took the decoded image (TS_IMAGE_RGB8) and preprocessed it itself: its
  // preprocessing is judged with its tower (else the harness's pixel tensor went in).
  bool preprocessed_by_backend = false;
};
EncoderCheck check_case_encoder(const Manifest& manifest, const ManifestCase& c,
                                const std::vector<float>& golden, BackendModel& model);

// multimodal.preprocess: the backend's own preprocessing (ABI v9 preprocess_image) of the
// case's decoded image against the harness's pixel tensor (the mmproj's processor, HF's
// bit for bit). The processors resize in 8-bit (Pillow), so a value is a whole number of
// levels of rescale_factor / std; an engine resampling with the same filter and rounding
// its own way differs by at most one level, another filter or geometry by more.
struct PreprocessCheck {
  int32_t n_frames = 0, height = 0, width = 0;               // the backend's tensor
  int32_t want_frames = 0, want_height = 0, want_width = 0;  // the processor's
  double nmse = 0.0, max_abs = 0.0;
  double max_levels = 0.0;  // max |diff| in levels (rescale_factor / the channel's std)
  // Where it fails with the right shape: the resampling filter with which the processor
  // reproduces the backend's tensor within one level ("bicubic": the backend resizes
  // with bicubic where the processor does not), or "" when none of Pillow's five does
  // (another geometry: padding, cropping, tiling).
  std::string matching_filter;
  // The first value that is NaN or infinite: "frame F, channel C, y Y, x X" ("" = none).
  std::string non_finite;
  bool same_shape() const {
    return n_frames == want_frames && height == want_height && width == want_width;
  }
  static constexpr double kMaxLevels = 1.0;  // the pass limit on max_levels
  bool passed() const { return same_shape() && max_levels <= kMaxLevels + 1e-6; }
};
PreprocessCheck check_case_preprocess(const Manifest& manifest, const ManifestCase& c,
                                      BackendModel& model);

// The prompt's text before and after kImagePlaceholder (Error naming the case when it
// is not there exactly once).
std::pair<std::string, std::string> split_at_image(const std::string& prompt,
                                                   const std::string& case_name);

}  // namespace touchstone
