// llamacpp_vision.h - llama.cpp's own vision path behind ABI v8 load_vision /
// encode_image: libmtmd (llama.cpp's tools/mtmd, built by ci/llamacpp) loads the
// mmproj, preprocesses the decoded image itself (its resize and normalisation for the
// projector type) and runs the tower and projector: mtmd_tokenize with one bitmap, then
// mtmd_encode_chunk of the image chunk and mtmd_get_output_embd. It takes only
// TS_IMAGE_RGB8 (the processor's pixel tensor cannot be handed to libmtmd's public API),
// so its preprocessing is judged together with its tower. docs/backends/llamacpp.md.
#pragma once

#include <llama.h>

#include <cstdint>
#include <string>

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

 private:
  mtmd_context* ctx_ = nullptr;
  int64_t n_embd_ = 0;
};

}  // namespace touchstone::llamacpp
