// llamacpp_vision.cpp - see llamacpp_vision.h.
#include "llamacpp_vision.h"

#include <ggml-backend.h>
#include <ggml.h>
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

struct MtmdTower::Chunks {
  std::unique_ptr<mtmd_bitmap, BitmapFree> bitmap;
  std::unique_ptr<mtmd_input_chunks, ChunksFree> all;
  std::vector<const mtmd_input_chunk*> images;  // the image chunks, in order
  int64_t n_tokens = 0;                         // theirs
};

// While pixels() runs: asks to observe the node that reads "inp_raw" and copies that
// input when the node is reached (the input is set before the graph runs).
bool MtmdTower::on_eval(ggml_tensor* t, bool ask, void* user) {
  auto* self = static_cast<MtmdTower*>(user);
  if (!self->capturing_ || self->captured_) return !ask;
  const ggml_tensor* in = nullptr;
  for (const ggml_tensor* s : t->src)
    if (s && std::strncmp(ggml_get_name(s), "inp_raw", 7) == 0) in = s;
  if (!in) return !ask;
  if (ask) return true;
  self->captured_w_ = in->ne[0];
  self->captured_h_ = in->ne[1];
  self->captured_n_ = in->ne[2] == 3 ? in->ne[3] : 0;  // 0: not an RGB input (refused)
  const size_t n = size_t(ggml_nelements(in));
  const size_t at = self->captured_values_.size();
  self->captured_values_.resize(at + n);
  ggml_backend_tensor_get(in, self->captured_values_.data() + at, 0, n * sizeof(float));
  self->captured_ = true;
  return true;
}

MtmdTower::MtmdTower(const std::string& path, const llama_model* model, int32_t n_threads)
    : n_embd_(llama_model_n_embd_inp(model)) {
  static std::once_flag once;
  std::call_once(once, [] { mtmd_log_set(mtmd_log, nullptr); });
  take_log();
  mtmd_context_params p = mtmd_context_params_default();
  p.use_gpu = false;
  p.print_timings = false;
  p.warmup = false;
  p.cb_eval = &MtmdTower::on_eval;
  p.cb_eval_user_data = this;
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

MtmdTower::Chunks MtmdTower::tokenize(const ts_image& img) {
  Chunks c;
  c.bitmap.reset(mtmd_bitmap_init(uint32_t(img.width), uint32_t(img.height),
                                  static_cast<const unsigned char*>(img.data)));
  c.all.reset(mtmd_input_chunks_init());
  const std::string marker = mtmd_default_marker();
  const mtmd_input_text text{marker.c_str(), marker.size(), false, true};
  const mtmd_bitmap* bitmaps[] = {c.bitmap.get()};
  if (mtmd_tokenize(ctx_, c.all.get(), &text, bitmaps, 1) != 0)
    throw StatusError(TS_ERR_INTERNAL, "mtmd_tokenize failed: " + take_log());
  // Every image chunk in order: one for most projectors, one per tile and the global
  // view for Idefics3 (libmtmd's slices, with text chunks between them).
  for (size_t i = 0; i < mtmd_input_chunks_size(c.all.get()); ++i) {
    const mtmd_input_chunk* ch = mtmd_input_chunks_get(c.all.get(), i);
    if (mtmd_input_chunk_get_type(ch) != MTMD_INPUT_CHUNK_TYPE_IMAGE) continue;
    c.images.push_back(ch);
    c.n_tokens += int64_t(mtmd_input_chunk_get_n_tokens(ch));
  }
  if (c.images.empty()) throw StatusError(TS_ERR_INTERNAL, "mtmd_tokenize made no image chunk");
  return c;
}

void MtmdTower::encode(const ts_image& img, float* out, int64_t n_floats) {
  if (img.format != TS_IMAGE_RGB8)
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "encode_image: llama.cpp's libmtmd preprocesses the image itself: it takes "
                      "the decoded image (TS_IMAGE_RGB8)");
  const Chunks c = tokenize(img);
  if (n_floats != c.n_tokens * n_embd_)
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "encode_image: n_floats " + std::to_string(n_floats) +
                          " != " + std::to_string(c.n_tokens) + " image tokens in " +
                          std::to_string(c.images.size()) + " image chunk(s) (libmtmd) x " +
                          std::to_string(n_embd_));
  for (const mtmd_input_chunk* image : c.images) {
    if (mtmd_encode_chunk(ctx_, image) != 0)
      throw StatusError(TS_ERR_INTERNAL, "mtmd_encode_chunk failed: " + take_log());
    const size_t n = mtmd_input_chunk_get_n_tokens(image) * size_t(n_embd_);
    std::memcpy(out, mtmd_get_output_embd(ctx_), n * sizeof(float));
    out += n;
  }
}

ts_pixel_shape MtmdTower::pixels(const ts_image& img, float* out, int64_t n_floats) {
  const Chunks c = tokenize(img);
  ts_pixel_shape shape{};
  shape.struct_size = sizeof shape;
  shape.channels = 3;
  captured_values_.clear();
  for (const mtmd_input_chunk* image : c.images) {
    captured_ = false;
    capturing_ = true;
    const int32_t rc = mtmd_encode_chunk(ctx_, image);
    capturing_ = false;
    if (rc != 0) throw StatusError(TS_ERR_INTERNAL, "mtmd_encode_chunk failed: " + take_log());
    if (!captured_ || captured_n_ < 1)
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "preprocess_image: libmtmd's tower graph read no RGB input named "
                        "inp_raw (clip.cpp build_inp_raw) for this projector");
    if (shape.n_frames > 0 && (captured_w_ != shape.width || captured_h_ != shape.height))
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "preprocess_image: libmtmd's image chunks differ in size (" +
                            std::to_string(shape.width) + " x " + std::to_string(shape.height) +
                            " then " + std::to_string(captured_w_) + " x " +
                            std::to_string(captured_h_) + "); the contract's frames are one size");
    shape.width = int32_t(captured_w_);
    shape.height = int32_t(captured_h_);
    shape.n_frames += int32_t(captured_n_);
  }
  if (!out) return shape;
  if (n_floats != int64_t(captured_values_.size()))
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "preprocess_image: n_floats " + std::to_string(n_floats) +
                          " != " + std::to_string(captured_values_.size()) + " (libmtmd's " +
                          std::to_string(shape.n_frames) + " frame(s) of 3 x " +
                          std::to_string(shape.height) + " x " + std::to_string(shape.width) + ")");
  std::memcpy(out, captured_values_.data(), captured_values_.size() * sizeof(float));
  return shape;
}

}  // namespace touchstone::llamacpp
