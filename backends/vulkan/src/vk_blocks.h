// vk_blocks.h - the device layouts of quantized weights.
//
// Split (Q4_0, Q4_1, Q8_0): a GGUF block (f16 scale(s) + packed quants: 18, 20
// or 34 bytes) is split in two so that every shader load is aligned: for a
// tensor of n_rows rows of n_in elements (nb = n_in / 32 blocks per row,
// block k = row * nb + b),
//   quants: words [k * QW, k * QW + QW)   (QW = 4 for Q4_0/Q4_1, 8 for Q8_0;
//           the GGUF quant bytes in order, so 16-byte aligned uvec4s)
//   scales: word n_rows * nb * QW + k      (Q4_1: d | m << 16; Q4_0, Q8_0: d)
// Padded (Q5_0, Q4_K, Q5_K, Q6_K): each GGUF block's bytes, in order, in a
// whole number of 32-bit words, blocks in GGUF order:
//   Q5_0 (22 -> 24 bytes): d, 2 zero bytes, qh[4], qs[16]
//   Q4_K (144 bytes), Q5_K (176 bytes): as stored
//   Q6_K (210 -> 212 bytes): ql[128], qh[64], scales[16], d, 2 zero bytes
// F32 tensors stay as they are. Read by quant.glsl and matmul_rows.comp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "touchstone/model/gguf.h"

namespace touchstone::vk {

// GGUF blocks of `type` (one of the types above) -> its device layout. Throws
// StatusError (TS_ERR_INTERNAL) for any other type.
std::vector<uint8_t> to_device_blocks(gguf::TensorType type, const uint8_t* blocks, size_t n_in,
                                      size_t n_rows);

}  // namespace touchstone::vk
