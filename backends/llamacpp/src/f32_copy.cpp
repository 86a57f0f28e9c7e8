// f32_copy.cpp - see f32_copy.h.
#include "f32_copy.h"

#include <llama.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "touchstone/abi/backend_adapter.hpp"

namespace touchstone::llamacpp {
namespace {

namespace fs = std::filesystem;
using touchstone::abi::StatusError;

// FNV-1a 64: a stable (implementation-independent) cache key.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string cache_name(const std::string& gguf_path) {
  std::error_code ec;
  const fs::path src = fs::canonical(gguf_path, ec);
  if (ec) throw StatusError(TS_ERR_IO, gguf_path + ": " + ec.message());
  const auto size = fs::file_size(src, ec);
  if (ec) throw StatusError(TS_ERR_IO, gguf_path + ": " + ec.message());
  const auto mtime = fs::last_write_time(src, ec).time_since_epoch().count();
  if (ec) throw StatusError(TS_ERR_IO, gguf_path + ": " + ec.message());
  char key[17];
  std::snprintf(key, sizeof key, "%016llx",
                static_cast<unsigned long long>(fnv1a(src.string() + "|" + std::to_string(size) +
                                                      "|" + std::to_string(mtime))));
  return src.stem().string() + "-" + key + ".f32.gguf";
}

}  // namespace

std::string f32_cache_dir() {
  if (const char* e = std::getenv("TOUCHSTONE_LLAMACPP_CACHE"); e && *e) return e;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/touchstone/llamacpp";
}

std::string f32_copy(const std::string& gguf_path) {
  const fs::path dir = f32_cache_dir();
  const fs::path dst = dir / cache_name(gguf_path);
  std::error_code ec;
  if (fs::is_regular_file(dst, ec)) return dst.string();
  fs::create_directories(dir, ec);
  if (ec) throw StatusError(TS_ERR_IO, "cannot create " + dir.string() + ": " + ec.message());
  const fs::path tmp = dst.string() + ".tmp." + std::to_string(::getpid());
  llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = LLAMA_FTYPE_ALL_F32;
  p.allow_requantize = true;  // the inputs are quantized: dequantize them
  p.quantize_output_tensor = true;
  p.pure = true;  // every tensor to F32, no per-tensor type mix
  p.nthread = 0;
  if (llama_model_quantize(gguf_path.c_str(), tmp.c_str(), &p) != 0) {
    fs::remove(tmp, ec);
    throw StatusError(TS_ERR_IO, "llama_model_quantize could not write an F32 copy of " +
                                     gguf_path + " to " + tmp.string());
  }
  fs::rename(tmp, dst, ec);
  if (ec) {
    fs::remove(tmp, ec);
    if (!fs::is_regular_file(dst)) throw StatusError(TS_ERR_IO, "cannot rename to " + dst.string());
  }
  return dst.string();
}

}  // namespace touchstone::llamacpp
