// vk_buffer.h - storage buffers: device-local (weights, activations, KV cache)
// and host-visible (token ids in, logits out).
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "vk_context.h"

namespace touchstone::vk {

class Buffer {
 public:
  enum class Kind { Device, Host };
  Buffer() = default;
  Buffer(Context& ctx, size_t bytes, Kind kind);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const { return buf_; }
  size_t size() const { return size_; }
  // Unique per allocation in this process (VkBuffer handles can be reused
  // after a buffer is freed, so caches key on this instead).
  uint64_t serial() const { return serial_; }
  // Host pointer when the memory is host-visible and coherent, else nullptr.
  void* mapped() const { return mapped_; }

  // Copies host data into the buffer at byte `offset`: a memcpy when mapped
  // (lavapipe, integrated GPUs), else through a staging buffer.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  // Fills with zero bytes.
  void zero();

 private:
  void release() noexcept;
  Context* ctx_ = nullptr;
  VkBuffer buf_ = VK_NULL_HANDLE;
  VkDeviceMemory mem_ = VK_NULL_HANDLE;
  size_t size_ = 0;
  void* mapped_ = nullptr;
  uint64_t serial_ = 0;
};

// What one binding of a dispatch sees: a whole buffer, or the byte range
// [offset, offset + size) of one (an expert's matrix inside the slab that holds
// its mixture-of-experts tensor, vk_weights.h). offset must be a multiple of the
// device's minStorageBufferOffsetAlignment.
struct BufferRange {
  // The whole buffer (implicit: dispatches take {&a, &b} lists).
  BufferRange(const Buffer* b) : buf(b) {}
  BufferRange(const Buffer& b) : buf(&b) {}
  BufferRange(const Buffer* b, VkDeviceSize off, VkDeviceSize n) : buf(b), offset(off), size(n) {}
  const Buffer* buf = nullptr;
  VkDeviceSize offset = 0;
  VkDeviceSize size = VK_WHOLE_SIZE;
};

}  // namespace touchstone::vk
