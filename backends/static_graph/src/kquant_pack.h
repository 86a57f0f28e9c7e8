// kquant_pack.h - the graph layouts of the GGUF block types beyond Q4_0 / Q4_1 /
// Q8_0 (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4): the stored quants repacked, never
// dequantized.
#pragma once

#include <cstdint>
#include <string>

#include "engine.h"
#include "touchstone/model/gguf.h"

namespace touchstone::static_graph {

// Packs rows [row0, row0 + out) of the GGUF matrix ti (n_in = in, blocks along
// in) into ws as `name`.qs / .d [/ .m] in the layout of graph.h's MatrixFormat
// and sets fmt:
//   Q5_0 -> Q8_0   (q - 16 as i8, d the block's f16 bits),
//   Q4_K -> Q4_1F  (per 32-row sub-block: 4-bit q, d*sc and -dmin*m in fp32),
//   Q6_K -> Q8_16F (q - 32 as i8, per 16-row sub-block d*sc in fp32),
//   Q5_1 -> Q8_1   (q as i8, d and m the block's f16 bits),
//   Q5_K -> Q8_1F  (q as i8, per 32-row sub-block d*sc and -dmin*m in fp32),
//   MXFP4 -> Q8_16F (the doubled e2m1 value as i8, each 32-row block's 2^(e-128) in
//                    fp32 for both of its 16-row halves).
// The graph's dequantization of these parts gives touchstone::gguf::dequantize's
// values bitwise (the scale products are exact in fp32). Returns false (and
// packs nothing) for any other type.
bool pack_kquant(const gguf::File& f, const gguf::TensorInfo& ti, const std::string& name,
                 int64_t in, int64_t out, int64_t row0, WeightSet& ws, MatrixFormat& fmt);

}  // namespace touchstone::static_graph
