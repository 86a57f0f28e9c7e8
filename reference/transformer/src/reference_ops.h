// reference_ops.h (internal to touchstone_reference) - the matrix-vector product and
// residual add of the reference forward pass, shared by its attention and FFN files.
// Numerics as documented in reference_forward.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "touchstone/model/faults.h"
#include "touchstone/model/weight_matrix.h"
#include "touchstone/reference/row_pool.h"

namespace touchstone::reference_ops {

// y[o] = W[o, :] . x (+ bias[o]) for W of shape [W.rows()][W.cols()] as stored in the GGUF
// file (each row dequantized into a per-thread buffer just before its dot product, F32
// rows read in place); rows split across the pool. bias may be null. Faults: fp16_accumulation (y
// rounded to fp16), thread_order_reduction, session_order_reduction and batch_token_count_split
// (per-slice fp32 sums with their slice counts).
void matvec(RowPool& pool, const WeightMatrix& W, const float* x, float* y, const Faults& f,
            const float* bias = nullptr);

// x += y elementwise (fp64 sum, one rounding).
void add_into(std::vector<float>& x, const std::vector<float>& y, int64_t n);

}  // namespace touchstone::reference_ops
