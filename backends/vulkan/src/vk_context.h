// vk_context.h - Vulkan instance, device selection, queue, validation errors.
//
// Device choice: discrete GPU > integrated GPU > virtual GPU > CPU (lavapipe);
// TOUCHSTONE_VULKAN_DEVICE=<index or name substring> overrides. With
// TOUCHSTONE_VULKAN_VALIDATION=1 the Khronos validation layer is enabled; every
// validation error is counted by a debug-utils messenger and turns the next
// check_validation() into a TS_ERR_INTERNAL failure.
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "touchstone/abi/backend_impl.h"

namespace touchstone::vk {

// A zero-initialized Vulkan struct with its sType set.
template <typename T>
T vk_struct(VkStructureType type) {
  T t{};
  t.sType = type;
  return t;
}

// Throws StatusError(TS_ERR_DEVICE, ...) naming the call and the VkResult.
void check(VkResult r, const char* what);

struct DeviceInfo {
  std::string name;                  // "llvmpipe (LLVM 15.0.6, 256 bits)"
  std::string type;                  // "cpu", "discrete", ...
  bool subgroup_arithmetic = false;  // subgroupAdd usable in compute shaders
  bool subgroup_shuffle = false;     // subgroupShuffle usable in compute shaders
  bool int64 = false;                // shaderInt64 (enabled when present)
  uint32_t subgroup_size = 0;
  uint64_t max_storage_buffer_range = 0;
  uint64_t min_storage_buffer_offset_alignment = 256;  // of a binding's byte offset
  uint32_t max_group_count_x = 0;
};

class Context {
 public:
  // Throws StatusError(TS_ERR_DEVICE) when no Vulkan loader / device is usable.
  static std::shared_ptr<Context> create();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  VkDevice device() const { return device_; }
  VkPhysicalDevice physical() const { return phys_; }
  const DeviceInfo& info() const { return info_; }
  bool validation() const { return validation_; }
  // "Vulkan: <device name>".
  std::string description() const { return "Vulkan: " + info_.name; }

  // Memory type index with all of `want`, preferring also `prefer`; throws if none.
  uint32_t memory_type(uint32_t type_bits, VkMemoryPropertyFlags want,
                       VkMemoryPropertyFlags prefer) const;

  // Records with `record`, submits, waits. Serialized on the queue.
  template <typename F>
  void run(F&& record) {
    VkCommandBuffer cb = begin();
    record(cb);
    submit_and_wait(cb);
  }
  VkCommandBuffer begin();
  void submit_and_wait(VkCommandBuffer cb);

  // Throws StatusError(TS_ERR_INTERNAL, first message) if the validation
  // layer reported an error since the context was created.
  void check_validation() const;
  // Subgroup variant of the shaders to use (TOUCHSTONE_VULKAN_SUBGROUP=0 forces the fallback).
  bool use_subgroup() const { return use_subgroup_; }
  // Matmul strategy matmul_rows.comp (rows per invocation, no barriers): on CPU
  // devices (lavapipe) with 8-wide subgroups, subgroupShuffle and shaderInt64;
  // TOUCHSTONE_VULKAN_MATMUL=rows|split overrides (rows on a device without
  // those is TS_ERR_UNSUPPORTED).
  bool matmul_row_per_invocation() const { return matmul_rows_; }

  // Called by the messenger.
  void on_validation_error(const char* message);

 private:
  // The steps of create(): the instance (validation layer and messenger when
  // asked), the physical device and what it offers (subgroups, int64, the
  // matmul shader choice), then the device, its queue, command pool and fence.
  void create_instance();
  void read_device();
  void create_device();
  Context() = default;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties mem_{};
  DeviceInfo info_;
  bool validation_ = false;
  bool use_subgroup_ = false;
  bool matmul_rows_ = false;
  std::mutex queue_mutex_;
  mutable std::mutex error_mutex_;
  std::atomic<int> n_validation_errors_{0};
  std::string first_validation_error_;
};

// The device create() would pick, as "Vulkan: <name>", or "Vulkan: no device (<why>)".
std::string probe_device_description();

}  // namespace touchstone::vk
