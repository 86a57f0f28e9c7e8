// ThreadPool: every task of every job runs exactly once, on a valid thread id,
// whatever the pool size relative to the cores (oversubscribed pools are how a
// busy machine looks to it), including jobs above the per-dispatch task limit.
#include "thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace touchstone::cpu_simd {
namespace {

void expect_each_task_once(ThreadPool& pool, size_t n_tasks) {
  std::vector<std::atomic<int>> hits(n_tasks);
  std::atomic<int> bad_thread{0};
  pool.run(n_tasks, [&](size_t task, int thread) {
    hits[task].fetch_add(1, std::memory_order_relaxed);
    if (thread < 0 || thread >= pool.size()) bad_thread.fetch_add(1);
  });
  for (size_t i = 0; i < n_tasks; ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i;
  EXPECT_EQ(bad_thread.load(), 0);
}

TEST(ThreadPool, EveryTaskOnceAcrossManyJobsAndSizes) {
  std::mt19937 rng(7);
  for (int threads : {1, 2, 3, 8}) {  // 8 threads on a 2-core machine: oversubscribed
    ThreadPool pool(threads);
    for (int job = 0; job < 2000; ++job) expect_each_task_once(pool, rng() % 97);
  }
}

TEST(ThreadPool, JobAboveThePerDispatchLimit) {
  ThreadPool pool(2);
  expect_each_task_once(pool, (size_t(1) << 20) + 12345);
}

TEST(ThreadPool, SlowTasksOnOneThreadDoNotLoseWork) {
  // Some tasks sleep: the other threads steal around them; all still run once.
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(64);
  pool.run(hits.size(), [&](size_t task, int) {
    if (task % 16 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    hits[task].fetch_add(1);
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace touchstone::cpu_simd
