// schedule.h - the transform-dialect schedule of the matmuls, generated per
// module (tile sizes chosen in C++ for the host's vector width) and applied
// between stage 1 (TOSA -> linalg on tensors) and bufferization. See
// docs/backends/static_graph.md, "The matmul schedule".
#pragma once

#include <string>

#include "compiler.h"
#include "mlir/IR/BuiltinOps.h"

namespace touchstone::static_graph {

// Tags the module's matmuls, generates the transform script and applies it
// (nothing when !opt.vectorize). Returns "" on success, else what failed (the
// MLIR diagnostics go to the context's handler, i.e. the caller's collector).
std::string apply_schedule(mlir::ModuleOp module, const CompileOptions& opt);

// Everything the schedule's output depends on besides the module (version,
// variant, host vector width, templates), for the pipeline description and
// hence the on-disk cache key; "" when !opt.vectorize.
std::string schedule_description(const CompileOptions& opt);

}  // namespace touchstone::static_graph
