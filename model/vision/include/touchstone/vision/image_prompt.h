// touchstone/vision/image_prompt.h - one image as a vision-language decoder's prompt
// takes it: the frames the tower encodes, and the text around their tokens.
//
// Gemma 3 (transformers models/gemma3/processing_gemma3.py): one frame (processor_of);
// its image tokens form one block the decoder attends bidirectionally (token_type_ids).
// Idefics3 / SmolVLM (models/idefics3/processing_idefics3.py,
// Idefics3Processor.replace_image_token): split_image_grid's frames (rows x cols tiles,
// then the global view), each frame's tokens a run of "<image>" tokens in the text
//   rows x cols > 0:  for each row r, for each column c:
//                       "<fake_token_around_image><row_{r+1}_col_{c+1}>" + "<image>" * n
//                     then "\n" after each row; then
//                     "\n<fake_token_around_image><global-img>" + "<image>" * n +
//                     "<fake_token_around_image>"
//   one frame:        "<fake_token_around_image><global-img>" + "<image>" * n +
//                     "<fake_token_around_image>"
// (n = the tower's tokens per frame), attended causally (a Llama decoder); HF's
// Idefics3Model.inputs_merger fills the "<image>" positions with the frames' tokens in
// order, as the goldens do (docs/vision.md).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/vision/image.h"
#include "touchstone/vision/image_splitting.h"
#include "touchstone/vision/vision_tower.h"

namespace touchstone::vision {

inline constexpr std::string_view kIdefics3ImageToken = "<image>";

struct PromptImage {
  std::vector<PixelValues> frames;  // each 3 x image_size x image_size
  int rows = 0, cols = 0;           // Idefics3's tile grid (0 x 0: one frame)
  bool bidirectional = false;       // the decoder attends the frames' tokens both ways
  // Idefics3: the text that replaces the prompt's image placeholder (runs of
  // kIdefics3ImageToken, one per frame); Gemma 3: empty (the tokens are one block where
  // the placeholder is).
  std::string layout;
};

// Idefics3's processor for a tower: tiles of the tower's image_size, the longest edge
// `longest_edge` (0: the mmproj's clip.vision.preproc_image_size, else 4 tiles, HF
// Idefics3ImageProcessor's default ratio, 1456 / 364), LANCZOS, the tower's mean and std.
SplittingProcessor splitting_processor_of(const VisionTowerConfig& c, int longest_edge = 0);

// The image (read_png(path, true)'s) through the processor the tower's keys describe.
// `path` names the mmproj in errors (an unknown projector). `resample`: every resize with
// this filter instead of the processor's (only a deliberately wrong backend sets it: the
// image_resample_filter fault).
PromptImage prompt_image(const Image& image, const VisionTowerConfig& c, const std::string& path,
                         std::optional<Filter> resample = std::nullopt);

// Idefics3Processor.replace_image_token's text for one image (see above).
std::string idefics3_image_prompt(int rows, int cols, int tokens_per_frame);

// A tokenized prompt with its image's runs of `token` taken out (HF's inputs_merger
// reversed): `text` the other ids in order, `at[f]` the index in `text` before which
// run f stood. Throws Error ("a run of N image tokens at position P; a frame has M")
// for a run of another length than `per_frame`.
struct ImageRuns {
  std::vector<int32_t> text;
  std::vector<int32_t> at;
};
ImageRuns take_image_runs(std::span<const int32_t> ids, int32_t token, size_t per_frame);

}  // namespace touchstone::vision
