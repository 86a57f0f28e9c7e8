// touchstone/llama_config.h - the plain-Llama gate of the backends that compute
// only plain Llama-family models.
//
// The reference and cpu_simd read every supported family (touchstone/model_config.h,
// read_model_config()). vulkan, static_graph and cuda compute only plain Llama:
// read_llama_config() gives them the same ModelConfig and refuses, with
// UnsupportedModel (TS_ERR_UNSUPPORTED) naming the missing features, anything else.
#pragma once

#include "touchstone/model_config.h"

namespace touchstone {

// read_model_config(), then UnsupportedModel naming the file and every feature a
// plain Llama backend lacks (e.g. "architecture 'gemma3', NeoX RoPE, QK-norm, ...")
// unless config.is_plain_llama().
ModelConfig read_llama_config(const gguf::File& file);

}  // namespace touchstone
