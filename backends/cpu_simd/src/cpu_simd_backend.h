#pragma once
#include <cstdint>

#include "touchstone/abi/backend_abi.h"
namespace touchstone::cpu_simd {
// The ts_backend table (exported by entry.cpp; linked directly by the unit tests).
const ts_backend* backend_table();
// ts_capabilities.batch_invariant_paths (with TS_CAP_BATCH_INVARIANT): the
// quantized path only (docs/backends/cpu_simd.md, "Batching"); the unit tests
// check exactly these paths bitwise.
inline constexpr uint32_t kBatchInvariantPaths = 1u << TS_WEIGHTS_QUANTIZED;
}  // namespace touchstone::cpu_simd
