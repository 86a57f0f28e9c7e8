// llamacpp_vision.h - llama.cpp's own vision path behind ABI v8 load_vision /
// encode_image: libmtmd (llama.cpp's tools/mtmd, built by ci/llamacpp) loads the
// mmproj, preprocesses the decoded image itself (its resize and normalisation for the
// projector type) and runs the tower and projector: mtmd_tokenize with one bitmap, then
// mtmd_encode_chunk of the image chunk and mtmd_get_output_embd. It takes only
// TS_IMAGE_RGB8 (the processor's pixel tensor cannot be handed to libmtmd's public API),
// so its preprocessing is judged together with its tower. Its pixel tensor (ABI v9
// preprocess_image) is read where the tower receives it: libmtmd's context is created with
// a ggml eval callback (mtmd_context_params.cb_eval) that, while a preprocess_image call
// runs, copies the graph input named "inp_raw" (clip.cpp's build_inp_raw: f32 [3][H][W]
// per image) from the first node that reads it. docs/backends/llamacpp.md.
#pragma once

#include <llama.h>

#include <cstdint>
#include <string>
#include <vector>

#include "touchstone/abi/backend_abi.h"

struct mtmd_context;

namespace touchstone::llamacpp {

class MtmdTower {
 public:
  // Throws abi::StatusError: TS_ERR_IO when libmtmd cannot load the file (its log),
  // TS_ERR_UNSUPPORTED when it has no vision input.
  MtmdTower(const std::string& mmproj_path, const llama_model* text_model, int32_t n_threads);
  ~MtmdTower();
  MtmdTower(const MtmdTower&) = delete;
  MtmdTower& operator=(const MtmdTower&) = delete;
  // n_floats must be the image chunk's tokens x the model's n_embd (else
  // TS_ERR_INVALID_ARGUMENT naming both); TS_ERR_UNSUPPORTED for TS_IMAGE_PIXELS_F32.
  void encode(const ts_image& image, float* out, int64_t n_floats);
  // The pixel tensor libmtmd's tower receives for the image, every image chunk in order
  // (each chunk encoded once, its "inp_raw" captured): its shape, and with `out` the
  // values (n_floats must be their count, else TS_ERR_INVALID_ARGUMENT).
  ts_pixel_shape pixels(const ts_image& image, float* out, int64_t n_floats);

 private:
  struct Chunks;  // an image's chunks after mtmd_tokenize
  Chunks tokenize(const ts_image& image);
  static bool on_eval(struct ggml_tensor* t, bool ask, void* self);
  mtmd_context* ctx_ = nullptr;
  int64_t n_embd_ = 0;
  bool capturing_ = false;  // inside pixels(): on_eval copies inp_raw
  bool captured_ = false;   // this chunk's inp_raw is in captured_values_
  int64_t captured_w_ = 0, captured_h_ = 0, captured_n_ = 0;  // its ne[0], ne[1], images
  std::vector<float> captured_values_;
};

}  // namespace touchstone::llamacpp
