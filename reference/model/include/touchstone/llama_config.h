// touchstone/llama_config.h - the configuration this repo's optimized backends compute.
//
// The reference reads every supported family (touchstone/model_config.h). The
// backends (cpu_simd, vulkan, static_graph, cuda) compute only plain Llama-family
// models: read_llama_config() gives them the same ModelConfig and refuses, with
// UnsupportedModel (TS_ERR_UNSUPPORTED) naming the missing features, anything else.
#pragma once

#include "touchstone/model_config.h"

namespace touchstone {

using LlamaConfig = ModelConfig;

// read_model_config(), then UnsupportedModel naming the file and every feature a
// plain Llama backend lacks (e.g. "architecture 'gemma3', NeoX RoPE, QK-norm, ...")
// unless config.is_plain_llama().
ModelConfig read_llama_config(const gguf::File& file);

}  // namespace touchstone
