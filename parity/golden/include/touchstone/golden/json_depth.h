// touchstone/golden/json_depth.h - the nesting limit of the JSON files Touchstone reads
// (manifests, known divergences, reports): checked before a parser sees them.
#pragma once

#include <string>
#include <string_view>

namespace touchstone {

// Deepest nesting of arrays and objects a JSON file may have.
inline constexpr int kMaxJsonDepth = 256;

// Throws touchstone::Error "FILE: JSON nested deeper than 256 levels at byte N"
// when `text` opens more than kMaxJsonDepth arrays / objects at once (brackets
// inside strings do not count). Linear time, constant memory.
void check_json_depth(std::string_view text, const std::string& file);

}  // namespace touchstone
