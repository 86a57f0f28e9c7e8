// touchstone/reference/row_pool.h - a tiny persistent thread pool that splits row ranges.
//
// run(n, fn) calls fn(begin, end) on contiguous, disjoint row ranges covering
// [0, n), one range per thread (static partition), and returns when all are
// done. Workers sleep on a condition variable between calls (no spinning), so
// an oversubscribed machine (ctest -j, other processes) is not slowed down.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace touchstone {

class RowPool {
 public:
  explicit RowPool(int n_threads);  // n_threads <= 1: run() executes inline
  ~RowPool();
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
  int size() const { return n_threads_; }

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_rows_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace touchstone
