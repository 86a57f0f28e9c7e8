// f32_copy.h - the full_precision weight path of the llamacpp backend.
//
// llama.cpp has no model parameter that dequantizes weights at load, so the
// full_precision path loads an F32 copy of the GGUF that llama.cpp's own
// quantizer writes (llama_model_quantize, LLAMA_FTYPE_ALL_F32, allow_requantize,
// pure: every quantized tensor dequantized by ggml's to_float, i.e. the same
// fp32 weights the reference computes with). The copy is cached on disk.
#pragma once

#include <string>

namespace touchstone::llamacpp {

// Directory of the F32 copies: $TOUCHSTONE_LLAMACPP_CACHE, else
// $HOME/.cache/touchstone/llamacpp.
std::string f32_cache_dir();

// Path of the cached F32 copy of `gguf_path`, writing it first when absent
// (to a temporary name, renamed into place: concurrent writers are harmless).
// The cache key is the canonical path, size and modification time of the input.
// Throws touchstone::abi::StatusError (TS_ERR_IO) when it cannot be written.
std::string f32_copy(const std::string& gguf_path);

}  // namespace touchstone::llamacpp
