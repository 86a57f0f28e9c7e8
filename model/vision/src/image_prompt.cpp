// image_prompt.cpp - see touchstone/vision/image_prompt.h.
#include "touchstone/vision/image_prompt.h"

#include <fmt/format.h>

#include "touchstone/common/error.h"

namespace touchstone::vision {

SplittingProcessor splitting_processor_of(const VisionTowerConfig& c, int longest_edge) {
  SplittingProcessor sp;
  sp.tile = c.image_size;
  sp.longest_edge = longest_edge > 0     ? longest_edge
                    : c.longest_edge > 0 ? c.longest_edge
                                         : 4 * c.image_size;
  sp.mean = c.mean;
  sp.std = c.std;
  return sp;
}

std::string idefics3_image_prompt(int rows, int cols, int tokens_per_frame) {
  std::string run;
  for (int i = 0; i < tokens_per_frame; ++i) run += kIdefics3ImageToken;
  const std::string fake = "<fake_token_around_image>";
  const std::string global = fake + "<global-img>" + run + fake;
  if (rows == 0 && cols == 0) return global;
  std::string out;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      out += fmt::format("{}<row_{}_col_{}>{}", fake, r + 1, c + 1, run);
    out += "\n";
  }
  return out + "\n" + global;
}

ImageRuns take_image_runs(std::span<const int32_t> ids, int32_t token, size_t per_frame) {
  ImageRuns out;
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] != token) {
      out.text.push_back(ids[i++]);
      continue;
    }
    size_t j = i;
    while (j < ids.size() && ids[j] == token) ++j;
    if (j - i != per_frame)
      throw Error("a run of {} image tokens (id {}) at position {}; a frame has {}", j - i, token,
                  i, per_frame);
    out.at.push_back(int32_t(out.text.size()));
    i = j;
  }
  return out;
}

PromptImage prompt_image(const Image& image, const VisionTowerConfig& c, const std::string& path,
                         std::optional<Filter> resample) {
  PromptImage out;
  if (c.projector == "idefics3") {
    SplittingProcessor sp = splitting_processor_of(c);
    if (resample) sp.resample = *resample;
    SplitImage s = split_image_grid(image, sp);
    out.frames = std::move(s.frames);
    out.rows = s.rows;
    out.cols = s.cols;
    out.layout = idefics3_image_prompt(s.rows, s.cols, c.n_tokens());
    return out;
  }
  ImageProcessor p = processor_of(c, path);
  if (resample) p.resample = *resample;
  out.frames.push_back(preprocess(image, p));
  out.bidirectional = true;  // gemma3 (processor_of refuses any other projector)
  return out;
}

}  // namespace touchstone::vision
