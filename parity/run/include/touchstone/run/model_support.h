// model_support.h - does a backend declare that it computes a model (ABI v3
// architectures / model_features), checked before load_model is called.
#pragma once

#include <optional>
#include <string>

#include "touchstone/runtime/backend.h"

namespace touchstone {

// nullopt when the backend declares nothing (api_version < 3 or NULL lists), when
// the reference cannot describe the model (load_model decides then), or when the
// model's architecture and every feature it needs are declared. Otherwise the
// reason, naming the backend and what is missing, e.g. "backend 'cpu_simd' computes
// architectures 'llama' only; the model is 'gemma3'".
std::optional<std::string> undeclared_model_support(const BackendLibrary& lib,
                                                    const std::string& gguf_path);

}  // namespace touchstone
