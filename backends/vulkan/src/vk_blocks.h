// vk_blocks.h - the device layout of quantized weights (Q4_0, Q4_1, Q8_0).
//
// A GGUF block (f16 scale(s) + packed quants: 18, 20 or 34 bytes) is split in
// two so that every shader load is aligned: for a tensor of n_rows rows of
// n_in elements (nb = n_in / 32 blocks per row, block k = row * nb + b),
//   quants: words [k * QW, k * QW + QW)   (QW = 4 for Q4_0/Q4_1, 8 for Q8_0;
//           the GGUF quant bytes in order, so 16-byte aligned uvec4s)
//   scales: word n_rows * nb * QW + k      (Q4_1: d | m << 16; Q4_0, Q8_0: d)
// F32 tensors stay as they are. Read by quant.glsl and matmul_rows.comp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "touchstone/gguf.h"

namespace touchstone::vk {

// GGUF blocks of `type` (Q4_0, Q4_1 or Q8_0) -> the device layout above.
std::vector<uint8_t> to_device_blocks(gguf::TensorType type, const uint8_t* blocks, size_t n_in,
                                      size_t n_rows);

}  // namespace touchstone::vk
