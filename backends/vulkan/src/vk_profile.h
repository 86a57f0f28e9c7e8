// vk_profile.h - per-kernel GPU time from timestamp queries, for tuning
// (TOUCHSTONE_VULKAN_PROFILE=1: a table on stderr when the session ends).
// A timestamp is written after every dispatch; the time between two
// consecutive timestamps is charged to the kernel dispatched between them.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "vk_context.h"

namespace touchstone::vk {

class Profiler {
 public:
  explicit Profiler(Context& ctx);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void begin(VkCommandBuffer cb);                            // resets the queries, first stamp
  void mark(VkCommandBuffer cb, const std::string& kernel);  // after a dispatch
  void collect();                                            // after the submit completed
  void print(const char* title) const;

 private:
  static constexpr uint32_t kMaxQueries = 4096;
  Context& ctx_;
  VkQueryPool pool_ = VK_NULL_HANDLE;
  std::vector<std::string> pending_;                          // kernel of query i + 1
  std::map<std::string, std::pair<double, uint64_t>> total_;  // ns, dispatches
};

}  // namespace touchstone::vk
