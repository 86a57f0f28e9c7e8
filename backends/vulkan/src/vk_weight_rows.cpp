// vk_weight_rows.cpp - GGUF rows -> the device formats of vk_weights.h.
#include "vk_weight_rows.h"

#include <algorithm>
#include <string>

#include "touchstone/model/quant.h"
#include "vk_blocks.h"
#include "vk_kernels.h"

namespace touchstone::vk {

using abi::StatusError;
using gguf::TensorType;

TensorType device_type(const gguf::TensorInfo& t, size_t n_in, bool quantized) {
  const gguf::TypeTraits& tt = gguf::type_traits(t.type);
  const bool aligned = n_in % (t.type == TensorType::F32 ? 4 : size_t(tt.block_size)) == 0;
  const TensorType type =
      (quantized || t.type == TensorType::F32) && shader_reads(t.type) && aligned ? t.type
                                                                                  : TensorType::F32;
  if (type == TensorType::F32 && n_in % 4 != 0)  // the shaders read fp32 rows as quads
    throw StatusError(TS_ERR_UNSUPPORTED, t.name + ": row length not a multiple of 4");
  if (type != t.type && !gguf::can_dequantize(t.type)) {
    throw StatusError(
        TS_ERR_UNSUPPORTED,
        t.name + ": type " + std::string(gguf::type_name(t.type)) + " cannot be dequantized");
  }
  return type;
}

size_t file_row_bytes(const gguf::TensorInfo& t, size_t n_in) {
  const gguf::TypeTraits& tt = gguf::type_traits(t.type);
  return n_in / tt.block_size * tt.type_size;
}

std::vector<uint8_t> device_rows(const gguf::TensorInfo& t, TensorType type, const uint8_t* first,
                                 size_t row_bytes, size_t n_in, size_t n_rows) {
  if (type == t.type && type == TensorType::F32)
    return std::vector<uint8_t>(first, first + n_rows * row_bytes);
  if (type == t.type) return to_device_blocks(type, first, n_in, n_rows);
  std::vector<uint8_t> out(n_rows * n_in * sizeof(float));
  float* v = reinterpret_cast<float*>(out.data());
  for (size_t r = 0; r < n_rows; ++r)
    gguf::dequantize_row(t.type, first + r * row_bytes, v + r * n_in, int64_t(n_in));
  return out;
}

size_t device_row_bytes(const gguf::TensorInfo& t, TensorType type, const uint8_t* first,
                        size_t n_in) {
  return device_rows(t, type, first, file_row_bytes(t, n_in), n_in, 1).size();
}

size_t rows_per_part(const Context& ctx, size_t device_row_bytes) {
  return std::max<size_t>(1, ctx.info().max_storage_buffer_range / device_row_bytes);
}

}  // namespace touchstone::vk
