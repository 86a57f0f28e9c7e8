// thread_pool.h - a small persistent fork-join pool (no allocation per job).
//
// run(n_tasks, fn) calls fn(task, thread) for task in [0, n_tasks); thread k of
// T runs the contiguous tasks [k*n/T, (k+1)*n/T) (static schedule), the calling
// thread is thread 0.
// Workers spin briefly after a job (most jobs of a forward pass follow each
// other within microseconds), then sleep on an atomic wait.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace ts_cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  template <typename F>
  void run(size_t n_tasks, F&& fn) {
    if (n_threads_ == 1 || n_tasks <= 1) {
      for (size_t i = 0; i < n_tasks; ++i) fn(i, 0);
      return;
    }
    auto thunk = [](void* ctx, size_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); };
    dispatch(thunk, &fn, n_tasks);
  }

 private:
  using Thunk = void (*)(void*, size_t, int);
  void dispatch(Thunk thunk, void* ctx, size_t n_tasks);
  void worker(int id);
  void work(int id);

  int n_threads_;
  std::vector<std::thread> threads_;
  Thunk thunk_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_tasks_ = 0;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace ts_cpu
