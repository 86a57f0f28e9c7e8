// touchstone/model/llama_weights.h - fp32 weights of a plain Llama-family model, for code
// that handles only those (see touchstone/model/llama_config.h).
#pragma once

#include "touchstone/model/llama_config.h"
#include "touchstone/model/model_weights.h"

namespace touchstone {

// read_llama_config() (UnsupportedModel for anything but a plain Llama), then
// load_model_weights().
ModelWeights load_llama_weights(const gguf::File& file);

}  // namespace touchstone
