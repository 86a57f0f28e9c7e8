// gptoss_config.h (internal to touchstone_model) - the gpt-oss part of read_model_config.
#pragma once

#include <set>
#include <string>

#include "touchstone/model/model_config.h"

namespace touchstone {

// The gpt-oss.* keys beyond the common ones (without the prefix).
std::set<std::string> gptoss_keys();

// Fills the gpt-oss structure of c (p = "gpt-oss."): attention biases and sinks, the
// alternating sliding window, YaRN. c.layers must hold n_layer entries.
void read_gptoss(const gguf::File& f, const std::string& p, ModelConfig& c);

}  // namespace touchstone
