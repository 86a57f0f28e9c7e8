// moe_config.h (internal to touchstone_model) - the mixture-of-experts part of
// read_model_config: MoeConfig from the {arch}.expert_* keys.
#pragma once

#include <set>
#include <string>

#include "touchstone/model/model_config.h"

namespace touchstone {

// The {arch}.* MoE keys read for the family (without the prefix); empty for a family
// that has no MoE variant here.
std::set<std::string> moe_keys(Family fam);

// Fills c.moe from the keys (p = "{arch}."). llama: MoE iff expert_count > 0
// (Mixtral); qwen3moe: expert_count and expert_used_count are required.
void read_moe(const gguf::File& f, const std::string& p, ModelConfig& c);

// gpt-oss's router, expert width and activation (called by read_moe).
void read_gptoss_moe(const gguf::File& f, const std::string& p, ModelConfig& c);

// Qwen2-MoE's expert widths (routed and shared) and router (called by read_moe).
void read_qwen2moe_moe(const gguf::File& f, const std::string& p, ModelConfig& c);

}  // namespace touchstone
