// What a backend declares, by name: capability flags and GGUF weight types
// (for `touchstone info` and the parity reports).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "touchstone/report/report.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

// TS_CAP_* bits by name ("all_position_logits", ...), in bit order.
std::vector<std::string> capability_flag_names(uint32_t flags);
// TS_WEIGHT_TYPE_BIT bits by GGUF type name ("F32", "Q4_1", ...), in type order.
std::vector<std::string> weight_type_names(uint64_t bits);
// The names joined with ',' or "none".
std::string joined_or_none(const std::vector<std::string>& names);

// ts_capabilities as the report keeps them.
BackendCapabilities describe_capabilities(const ts_capabilities& c);

}  // namespace touchstone
