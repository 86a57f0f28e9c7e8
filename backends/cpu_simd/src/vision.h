// vision.h - cpu_simd's own vision tower and projector (ABI v8 TS_CAP_MULTIMODAL):
// the SigLIP encoder, Gemma 3's projector and Idefics3's pixel-shuffle connector of
// touchstone/vision/vision_tower.h (formulas and sources there), in fp32 with OpenBLAS
// sgemm for every matrix product (the patch convolution as im2col, attention as Q K^T
// and P V per head) instead of the reference's fp64 scalar sums. Weights come from the
// shared mmproj loader (load_vision_tower), as the text weights come from the GGUF reader.
// Its preprocessing (ABI v9 preprocess_image) is the project's processor library
// (touchstone/vision/image_prompt.h), the one place a deliberate resampling fault can go.
#pragma once

#include <string>
#include <vector>

#include "touchstone/model/faults.h"
#include "touchstone/vision/image_prompt.h"
#include "touchstone/vision/vision_tower.h"

namespace touchstone::cpu_simd {

class SimdVision {
 public:
  // Throws touchstone::Error naming the file and key or tensor (load_vision_tower).
  explicit SimdVision(const std::string& mmproj_path);
  const vision::VisionTowerConfig& config() const { return t_.config; }
  // pixels: 3 x image_size x image_size float32 (the processor's output); out:
  // n_tokens() x n_embd_text float32.
  void encode(const float* pixels, float* out) const;
  // The decoded image's frames as the mmproj's processor makes them (each 3 x image_size x
  // image_size), with the image_resample_filter fault's filter where it is set.
  vision::PromptImage preprocess(const vision::Image& rgb) const;
  // The vision-path faults (Faults::vision_path) of `f`; the others are ignored.
  void set_faults(const Faults& f) { faults_ = f; }

 private:
  std::vector<float> patches(const float* pixels) const;  // [n_patches][n_embd]
  void layer(const vision::VisionLayer& L, std::vector<float>& x) const;
  void project(const std::vector<float>& x, float* out) const;
  std::string path_;
  vision::VisionTower t_;
  Faults faults_;
};

}  // namespace touchstone::cpu_simd
