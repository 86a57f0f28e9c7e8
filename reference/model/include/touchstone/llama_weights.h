// touchstone/llama_weights.h - fp32 weights of a plain Llama-family model, for code
// that handles only those (see touchstone/llama_config.h).
#pragma once

#include "touchstone/llama_config.h"
#include "touchstone/model_weights.h"

namespace touchstone {

// read_llama_config() (UnsupportedModel for anything but a plain Llama), then
// load_model_weights().
ModelWeights load_llama_weights(const gguf::File& file);

}  // namespace touchstone
