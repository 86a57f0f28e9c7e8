// touchstone/abi/backend_impl.h - in-tree helpers for implementing the C ABI.
//
// The shared argument checks, guard() and touchstone::BackendAdapter<Impl> live
// in the installed, standard-library-only touchstone/abi/backend_adapter.hpp; this
// header adds what needs Touchstone's own libraries (touchstone::Error, the
// fault catalog).
#pragma once

#include <fstream>
#include <string>
#include <thread>

#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/common/error.h"

namespace touchstone::abi {

// Runs a model loader: UnsupportedModel (another family, a feature the backend
// lacks) becomes TS_ERR_UNSUPPORTED, any other touchstone::Error (a file it
// cannot read or parse) TS_ERR_IO, naming the file.
template <typename F>
auto load_or_status(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const StatusError&) {
    throw;
  } catch (const touchstone::UnsupportedModel& e) {
    throw StatusError(TS_ERR_UNSUPPORTED, e.what());
  } catch (const touchstone::Error& e) {
    throw StatusError(TS_ERR_IO, e.what());
  }
}

// encode_image (ABI v8) for a backend whose tower takes the processor's pixel tensor
// (TS_IMAGE_PIXELS_F32) of image_size x image_size and writes n_tokens x n_embd floats:
// the pixels, or TS_ERR_UNSUPPORTED (another format) / TS_ERR_INVALID_ARGUMENT (another
// size, n_floats not the output's size), each naming what it expected.
inline const float* tower_pixels(const ts_image& img, int32_t image_size, int64_t n_tokens,
                                 int64_t n_embd, int64_t n_floats) {
  if (img.format != TS_IMAGE_PIXELS_F32)
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "encode_image: this backend's tower takes the processor's pixel tensor "
                      "(TS_IMAGE_PIXELS_F32), not the decoded image");
  if (img.height != image_size || img.width != image_size)
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "encode_image: a " + std::to_string(img.height) + " x " +
                          std::to_string(img.width) + " image; the tower takes " +
                          std::to_string(image_size) + " x " + std::to_string(image_size));
  if (n_floats != n_tokens * n_embd)
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "encode_image: n_floats " + std::to_string(n_floats) +
                          " != " + std::to_string(n_tokens) + " image tokens x " +
                          std::to_string(n_embd) + " = " + std::to_string(n_tokens * n_embd));
  return static_cast<const float*>(img.data);
}

// preprocess_image (ABI v9) for a backend whose preprocessing gives frames of 3 x height x
// width float32 (each with .height, .width and .values, all of one size): their shape, and
// with `out` the frames in order, or TS_ERR_INVALID_ARGUMENT when n_floats is not their size.
template <class Frame>
ts_pixel_shape pixel_frames(const std::vector<Frame>& frames, float* out, int64_t n_floats) {
  ts_pixel_shape s{};
  s.struct_size = sizeof s;
  s.n_frames = int32_t(frames.size());
  s.channels = 3;
  s.height = frames.empty() ? 0 : int32_t(frames[0].height);
  s.width = frames.empty() ? 0 : int32_t(frames[0].width);
  if (!out) return s;
  const int64_t n = int64_t(s.n_frames) * 3 * s.height * s.width;
  if (n_floats != n)
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "preprocess_image: n_floats " + std::to_string(n_floats) +
                          " != " + std::to_string(s.n_frames) + " frame(s) x 3 x " +
                          std::to_string(s.height) + " x " + std::to_string(s.width) + " = " +
                          std::to_string(n));
  for (const Frame& f : frames) out = std::copy(f.values.begin(), f.values.end(), out);
  return s;
}

// The start of a CPU backend's device_name: "CPU: <model name of
// /proc/cpuinfo> (<N> hardware threads" (the caller closes the parenthesis
// after adding its own facts). "unknown CPU" where /proc/cpuinfo has no model.
inline std::string cpu_device_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(f, line)) {
    const auto p = line.find(':');
    if (line.rfind("model name", 0) == 0 && p != std::string::npos) {
      model = line.substr(p + 2);
      break;
    }
  }
  return "CPU: " + model + " (" + std::to_string(std::thread::hardware_concurrency()) +
         " hardware threads";
}

}  // namespace touchstone::abi
