// reference_ops.h (internal to touchstone_reference) - the matrix-vector product and
// residual add of the reference forward pass, shared by its attention and FFN files.
// Numerics as documented in reference_forward.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "touchstone/model/faults.h"
#include "touchstone/reference/row_pool.h"

namespace touchstone::reference_ops {

// y[o] = W[o, :] . x (+ bias[o]) for a row-major W of shape [n_out][n_in]; rows split
// across the pool. bias may be null. Faults: fp16_accumulation (y rounded to fp16),
// thread_order_reduction, session_order_reduction and batch_token_count_split
// (per-slice fp32 sums with their slice counts).
void matvec(RowPool& pool, const float* W, const float* x, float* y, int64_t n_out, int64_t n_in,
            const Faults& f, const float* bias = nullptr);

// x += y elementwise (fp64 sum, one rounding).
void add_into(std::vector<float>& x, const std::vector<float>& y, int64_t n);

}  // namespace touchstone::reference_ops
