#pragma once
#include "touchstone/backend_abi.h"
namespace ts_cpu {
// The ts_backend table (exported by entry.cpp; linked directly by the unit tests).
const ts_backend* backend_table();
}  // namespace ts_cpu
