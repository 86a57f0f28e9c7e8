// vk_blocks.cpp - GGUF quantized blocks -> the device layouts (vk_blocks.h).
#include "vk_blocks.h"

#include <cstring>

#include "touchstone/abi/backend_impl.h"
#include "touchstone/model/quant.h"

namespace touchstone::vk {
namespace {

// Q4_0, Q4_1, Q8_0: quants of every block first, then one scale word per block.
std::vector<uint8_t> split_blocks(const uint8_t* blocks, size_t n_blocks, size_t block_bytes,
                                  size_t scale_bytes) {
  const size_t quant_bytes = block_bytes - scale_bytes;
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

// Q5_0, K-quants: every block's bytes in a slot of padded_bytes, with
// (padded_bytes - block_bytes) zero bytes inserted at byte gap_at.
std::vector<uint8_t> pad_blocks(const uint8_t* blocks, size_t n_blocks, size_t block_bytes,
                                size_t padded_bytes, size_t gap_at) {
  std::vector<uint8_t> out(n_blocks * padded_bytes, 0);
  const size_t gap = padded_bytes - block_bytes;
  for (size_t k = 0; k < n_blocks; ++k) {
    const uint8_t* b = blocks + k * block_bytes;
    uint8_t* o = out.data() + k * padded_bytes;
    std::memcpy(o, b, gap_at);
    std::memcpy(o + gap_at + gap, b + gap_at, block_bytes - gap_at);
  }
  return out;
}

}  // namespace

std::vector<uint8_t> to_device_blocks(gguf::TensorType type, const uint8_t* blocks, size_t n_in,
                                      size_t n_rows) {
  using gguf::TensorType;
  const gguf::TypeTraits& tt = gguf::type_traits(type);
  const size_t n_blocks = n_in / tt.block_size * n_rows, bytes = tt.type_size;
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q8_0:
      return split_blocks(blocks, n_blocks, bytes, 2);
    case TensorType::Q4_1:
      return split_blocks(blocks, n_blocks, bytes, 4);
    case TensorType::Q5_0:
      return pad_blocks(blocks, n_blocks, bytes, 24, 2);  // after d
    case TensorType::Q4_K:
    case TensorType::Q5_K:
      return pad_blocks(blocks, n_blocks, bytes, bytes, bytes);  // word multiples already
    case TensorType::Q6_K:
      return pad_blocks(blocks, n_blocks, bytes, 212, bytes);  // after d
    default:
      throw abi::StatusError(TS_ERR_INTERNAL, "to_device_blocks: no device layout for " +
                                                  std::string(gguf::type_name(type)));
  }
}

}  // namespace touchstone::vk
