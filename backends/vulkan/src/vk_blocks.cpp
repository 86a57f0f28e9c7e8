// vk_blocks.cpp - GGUF quantized blocks -> the split device layout (vk_blocks.h).
#include "vk_blocks.h"

#include <cstring>

#include "touchstone/backend_impl.h"

namespace touchstone::vk {

std::vector<uint8_t> to_device_blocks(gguf::TensorType type, const uint8_t* blocks, size_t n_in,
                                      size_t n_rows) {
  size_t block_bytes = 0, scale_bytes = 0;
  switch (type) {
    case gguf::TensorType::Q4_0:
      block_bytes = 18, scale_bytes = 2;
      break;
    case gguf::TensorType::Q4_1:
      block_bytes = 20, scale_bytes = 4;
      break;
    case gguf::TensorType::Q8_0:
      block_bytes = 34, scale_bytes = 2;
      break;
    default:
      throw abi::StatusError(TS_ERR_INTERNAL, "to_device_blocks: not Q4_0, Q4_1 or Q8_0");
  }
  const size_t n_blocks = n_in / 32 * n_rows, quant_bytes = block_bytes - scale_bytes;
  std::vector<uint8_t> out(n_blocks * (quant_bytes + 4), 0);
  uint8_t* quants = out.data();
  uint8_t* scales = out.data() + n_blocks * quant_bytes;
  for (size_t k = 0; k < n_blocks; ++k) {
    const uint8_t* b = blocks + k * block_bytes;
    std::memcpy(scales + 4 * k, b, scale_bytes);
    std::memcpy(quants + k * quant_bytes, b + scale_bytes, quant_bytes);
  }
  return out;
}

}  // namespace touchstone::vk
