// vk_buffer.cpp - buffer allocation (one VkDeviceMemory per buffer) and upload.
#include "vk_buffer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

namespace touchstone::vk {

namespace {
std::atomic<uint64_t> g_next_serial{1};
}  // namespace

Buffer::Buffer(Context& ctx, size_t bytes, Kind kind)
    : ctx_(&ctx), size_(bytes), serial_(g_next_serial++) {
  if (bytes > ctx.info().max_storage_buffer_range) {
    throw abi::StatusError(TS_ERR_UNSUPPORTED,
                           "buffer of " + std::to_string(bytes) +
                               " bytes exceeds maxStorageBufferRange " +
                               std::to_string(ctx.info().max_storage_buffer_range));
  }
  auto bci = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  // Rounded up to whole 32-bit words: shaders read quantized blocks (18 or 34
  // bytes) as uint[], so a tail that is not a whole word must still be in range.
  bci.size = std::max<size_t>((bytes + 3) / 4 * 4, 16);
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
              VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(ctx.device(), &bci, nullptr, &buf_), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(ctx.device(), buf_, &req);
  const VkMemoryPropertyFlags hv =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const uint32_t type =
      kind == Kind::Device
          ? ctx.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, hv)
          : ctx.memory_type(req.memoryTypeBits, hv, VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  auto ai = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  try {
    check(vkAllocateMemory(ctx.device(), &ai, nullptr, &mem_), "vkAllocateMemory");
    check(vkBindBufferMemory(ctx.device(), buf_, mem_, 0), "vkBindBufferMemory");
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(ctx.physical(), &mp);
    if ((mp.memoryTypes[type].propertyFlags & hv) == hv) {
      check(vkMapMemory(ctx.device(), mem_, 0, VK_WHOLE_SIZE, 0, &mapped_), "vkMapMemory");
    }
  } catch (...) {
    release();
    throw;
  }
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)),
      buf_(std::exchange(o.buf_, VK_NULL_HANDLE)),
      mem_(std::exchange(o.mem_, VK_NULL_HANDLE)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, nullptr)),
      serial_(std::exchange(o.serial_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ctx_ = std::exchange(o.ctx_, nullptr);
    buf_ = std::exchange(o.buf_, VK_NULL_HANDLE);
    mem_ = std::exchange(o.mem_, VK_NULL_HANDLE);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, nullptr);
    serial_ = std::exchange(o.serial_, 0);
  }
  return *this;
}

void Buffer::release() noexcept {
  if (!ctx_) return;
  if (mapped_) vkUnmapMemory(ctx_->device(), mem_);
  if (buf_) vkDestroyBuffer(ctx_->device(), buf_, nullptr);
  if (mem_) vkFreeMemory(ctx_->device(), mem_, nullptr);
  buf_ = VK_NULL_HANDLE;
  mem_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
}

void Buffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > size_)
    throw abi::StatusError(TS_ERR_INTERNAL, "Buffer::upload out of range");
  if (mapped_) {
    std::memcpy(static_cast<char*>(mapped_) + offset, src, bytes);
    return;
  }
  constexpr size_t kChunk = size_t(16) << 20;
  Buffer staging(*ctx_, std::min(bytes, kChunk), Kind::Host);
  for (size_t done = 0; done < bytes; done += kChunk) {
    const size_t n = std::min(kChunk, bytes - done);
    std::memcpy(staging.mapped(), static_cast<const char*>(src) + done, n);
    ctx_->run([&](VkCommandBuffer cb) {
      VkBufferCopy region{0, offset + done, n};
      vkCmdCopyBuffer(cb, staging.handle(), buf_, 1, &region);
    });
  }
}

void Buffer::zero() {
  if (mapped_) {
    std::memset(mapped_, 0, size_);
    return;
  }
  ctx_->run([&](VkCommandBuffer cb) { vkCmdFillBuffer(cb, buf_, 0, VK_WHOLE_SIZE, 0); });
}

}  // namespace touchstone::vk
