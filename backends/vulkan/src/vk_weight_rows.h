// vk_weight_rows.h - rows of a GGUF tensor in the device format the shaders read
// (vk_weights.h): which format a tensor gets on a weight path, and the bytes of a
// range of its rows in that format. Shared by the dense matrices (vk_weights.cpp)
// and the mixture-of-experts slabs (vk_experts.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "touchstone/model/gguf.h"
#include "vk_context.h"

namespace touchstone::vk {

// The device format of tensor t (rows of n_in elements): its own type when the
// shaders read it and the path keeps blocks (quantized, or F32 on any path), else
// F32 (dequantized on the host). Throws StatusError(TS_ERR_UNSUPPORTED) for an
// fp32 row length that is not a multiple of 4 or a type that cannot be dequantized.
gguf::TensorType device_type(const gguf::TensorInfo& t, size_t n_in, bool quantized);

// Bytes of one row of n_in elements of t in the file.
size_t file_row_bytes(const gguf::TensorInfo& t, size_t n_in);

// n_rows rows starting at `first` (row_bytes apart in the file) in the device
// format `type` (device_type's answer): its own layout (vk_blocks.h) or fp32.
std::vector<uint8_t> device_rows(const gguf::TensorInfo& t, gguf::TensorType type,
                                 const uint8_t* first, size_t row_bytes, size_t n_in,
                                 size_t n_rows);

// Device bytes of one row in format `type` (every layout is linear in rows).
size_t device_row_bytes(const gguf::TensorInfo& t, gguf::TensorType type, const uint8_t* first,
                        size_t n_in);

// Rows per buffer part: as many as fit in maxStorageBufferRange (at least 1).
size_t rows_per_part(const Context& ctx, size_t device_row_bytes);

}  // namespace touchstone::vk
