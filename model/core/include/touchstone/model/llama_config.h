// touchstone/model/llama_config.h - a plain-Llama gate over read_model_config().
//
// Every in-tree backend reads every supported family (touchstone/model/model_config.h,
// read_model_config()). read_llama_config() gives code that handles only a plain
// Llama (tests and tools written for one, a backend of your own that starts there)
// the same ModelConfig and refuses, with UnsupportedModel (TS_ERR_UNSUPPORTED)
// naming the missing features, anything else.
#pragma once

#include "touchstone/model/model_config.h"

namespace touchstone {

// read_model_config(), then UnsupportedModel naming the file and every feature a
// plain Llama backend lacks (e.g. "architecture 'gemma3', NeoX RoPE, QK-norm, ...")
// unless config.is_plain_llama().
ModelConfig read_llama_config(const gguf::File& file);

}  // namespace touchstone
