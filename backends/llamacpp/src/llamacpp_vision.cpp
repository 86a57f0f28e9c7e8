// llamacpp_vision.cpp - see llamacpp_vision.h.
#include "llamacpp_vision.h"

#include <mtmd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "log_tail.h"
#include "touchstone/abi/backend_adapter.hpp"

namespace touchstone::llamacpp {
namespace {

using abi::StatusError;

// libmtmd's log: kept (the latest ~2 KB of warnings and errors) for the error messages,
// never printed.
LogTail g_log(GGML_LOG_LEVEL_WARN);
void mtmd_log(ggml_log_level level, const char* text, void*) { g_log.add(level, text); }
std::string take_log() { return g_log.take(); }

struct ChunksFree {
  void operator()(mtmd_input_chunks* c) const { mtmd_input_chunks_free(c); }
};
struct BitmapFree {
  void operator()(mtmd_bitmap* b) const { mtmd_bitmap_free(b); }
};

}  // namespace

MtmdTower::MtmdTower(const std::string& path, const llama_model* model, int32_t n_threads)
    : n_embd_(llama_model_n_embd_inp(model)) {
  static std::once_flag once;
  std::call_once(once, [] { mtmd_log_set(mtmd_log, nullptr); });
  take_log();
  mtmd_context_params p = mtmd_context_params_default();
  p.use_gpu = false;
  p.print_timings = false;
  p.warmup = false;
  if (n_threads > 0) p.n_threads = n_threads;
  ctx_ = mtmd_init_from_file(path.c_str(), model, p);
  if (!ctx_) throw StatusError(TS_ERR_IO, "libmtmd cannot load " + path + ": " + take_log());
  if (!mtmd_support_vision(ctx_)) {
    mtmd_free(ctx_);
    ctx_ = nullptr;
    throw StatusError(TS_ERR_UNSUPPORTED, path + ": libmtmd reads no vision input from it");
  }
}

MtmdTower::~MtmdTower() {
  if (ctx_) mtmd_free(ctx_);
}

void MtmdTower::encode(const ts_image& img, float* out, int64_t n_floats) {
  if (img.format != TS_IMAGE_RGB8)
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "encode_image: llama.cpp's libmtmd preprocesses the image itself: it takes "
                      "the decoded image (TS_IMAGE_RGB8)");
  std::unique_ptr<mtmd_bitmap, BitmapFree> bitmap(mtmd_bitmap_init(
      uint32_t(img.width), uint32_t(img.height), static_cast<const unsigned char*>(img.data)));
  std::unique_ptr<mtmd_input_chunks, ChunksFree> chunks(mtmd_input_chunks_init());
  const std::string marker = mtmd_default_marker();
  const mtmd_input_text text{marker.c_str(), marker.size(), false, true};
  const mtmd_bitmap* bitmaps[] = {bitmap.get()};
  if (mtmd_tokenize(ctx_, chunks.get(), &text, bitmaps, 1) != 0)
    throw StatusError(TS_ERR_INTERNAL, "mtmd_tokenize failed: " + take_log());
  // Every image chunk in order: one for most projectors, one per tile and the global
  // view for Idefics3 (libmtmd's slices, with text chunks between them).
  std::vector<const mtmd_input_chunk*> images;
  int64_t want = 0;
  for (size_t i = 0; i < mtmd_input_chunks_size(chunks.get()); ++i) {
    const mtmd_input_chunk* c = mtmd_input_chunks_get(chunks.get(), i);
    if (mtmd_input_chunk_get_type(c) != MTMD_INPUT_CHUNK_TYPE_IMAGE) continue;
    images.push_back(c);
    want += int64_t(mtmd_input_chunk_get_n_tokens(c)) * n_embd_;
  }
  if (images.empty()) throw StatusError(TS_ERR_INTERNAL, "mtmd_tokenize made no image chunk");
  if (n_floats != want)
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "encode_image: n_floats " + std::to_string(n_floats) +
                          " != " + std::to_string(want / n_embd_) + " image tokens in " +
                          std::to_string(images.size()) + " image chunk(s) (libmtmd) x " +
                          std::to_string(n_embd_));
  for (const mtmd_input_chunk* image : images) {
    if (mtmd_encode_chunk(ctx_, image) != 0)
      throw StatusError(TS_ERR_INTERNAL, "mtmd_encode_chunk failed: " + take_log());
    const size_t n = mtmd_input_chunk_get_n_tokens(image) * size_t(n_embd_);
    std::memcpy(out, mtmd_get_output_embd(ctx_), n * sizeof(float));
    out += n;
  }
}

}  // namespace touchstone::llamacpp
