// thread_pool.h - a small persistent fork-join pool (no allocation per job).
//
// run(n_tasks, fn) calls fn(task, thread) once for every task in [0, n_tasks);
// the calling thread is thread 0. Schedule: thread k of T owns the contiguous
// tasks [k*n/T, (k+1)*n/T) and takes them front to back (one contiguous weight
// stream per thread, which the hardware prefetchers follow); a thread that has
// finished its own range takes the remaining tasks of the others from the back
// (work stealing), so a thread the OS has descheduled delays a job by at most
// the task it is running, not by its whole range. Which thread runs a task
// never changes its result (tasks are independent); `thread` only names
// per-thread scratch.
// Workers spin briefly after a job (most jobs of a forward pass follow each
// other within microseconds), then sleep on an atomic wait.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
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
  // The unclaimed tasks [front, back) of one thread's range, packed in one word
  // so that the owner (front) and thieves (back) claim with one CAS each.
  struct alignas(64) Range {
    std::atomic<uint64_t> fb{0};
  };
  void dispatch(Thunk thunk, void* ctx, size_t n_tasks);
  void worker(int id);
  void work(int id);
  bool claim_front(int k, size_t* task);
  bool claim_back(int k, size_t* task);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::unique_ptr<Range[]> ranges_;
  Thunk thunk_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_tasks_ = 0;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace ts_cpu
