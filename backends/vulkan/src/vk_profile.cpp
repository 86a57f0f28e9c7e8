// vk_profile.cpp - timestamp queries per dispatch, summed per kernel.
#include "vk_profile.h"

#include <algorithm>
#include <cstdio>

namespace touchstone::vk {

Profiler::Profiler(Context& ctx) : ctx_(ctx) {
  auto qi = vk_struct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = kMaxQueries;
  check(vkCreateQueryPool(ctx_.device(), &qi, nullptr, &pool_), "vkCreateQueryPool");
}

Profiler::~Profiler() {
  if (pool_) vkDestroyQueryPool(ctx_.device(), pool_, nullptr);
}

void Profiler::begin(VkCommandBuffer cb) {
  pending_.clear();
  vkCmdResetQueryPool(cb, pool_, 0, kMaxQueries);
  vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool_, 0);
}

void Profiler::mark(VkCommandBuffer cb, const std::string& kernel) {
  if (pending_.size() + 1 >= kMaxQueries) return;
  pending_.push_back(kernel);
  vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool_, uint32_t(pending_.size()));
}

void Profiler::collect() {
  const uint32_t n = uint32_t(pending_.size()) + 1;
  std::vector<uint64_t> ts(n);
  check(vkGetQueryPoolResults(ctx_.device(), pool_, 0, n, n * sizeof(uint64_t), ts.data(),
                              sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  VkPhysicalDeviceProperties p{};
  vkGetPhysicalDeviceProperties(ctx_.physical(), &p);
  for (uint32_t i = 1; i < n; ++i) {
    auto& [ns, count] = total_[pending_[i - 1]];
    ns += double(ts[i] - ts[i - 1]) * double(p.limits.timestampPeriod);
    ++count;
  }
  pending_.clear();
}

void Profiler::print(const char* title) const {
  std::vector<std::pair<double, std::string>> rows;
  double all = 0.0;
  for (const auto& [k, v] : total_) {
    rows.emplace_back(v.first, k);
    all += v.first;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(stderr, "vulkan profile (%s): %.1f ms in dispatches\n", title, all * 1e-6);
  for (const auto& [ns, k] : rows) {
    const auto& v = total_.at(k);
    std::fprintf(stderr, "  %-24s %10.2f ms %6.1f%% %8llu dispatches %9.1f us each\n", k.c_str(),
                 ns * 1e-6, 100.0 * ns / all, static_cast<unsigned long long>(v.second),
                 ns * 1e-3 / double(v.second));
  }
}

}  // namespace touchstone::vk
