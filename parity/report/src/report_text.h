// Small helpers shared by the report writers (table, JSON, HTML, Markdown).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace touchstone::report_detail {

// Token bytes as a quoted, escaped string: "\"a\\n\"".
inline std::string printable(const std::string& bytes) { return fmt::format("{:?}", bytes); }

inline double finite_or(double v, double fallback) { return std::isfinite(v) ? v : fallback; }

}  // namespace touchstone::report_detail
