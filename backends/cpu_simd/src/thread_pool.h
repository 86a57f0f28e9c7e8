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
// A job is complete when all of its TASKS are done, not when every worker has
// checked in: a worker the OS has not scheduled yet (a busy machine, a noisy
// neighbour) costs the job nothing; thread 0 steals its whole range. Each
// range word carries the job's generation tag, so a worker that wakes late
// can never claim a task of a later job with a stale view.
// Workers spin briefly after a job (most jobs of a forward pass follow each
// other within microseconds), then sleep on an atomic wait.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace touchstone::cpu_simd {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Solo mode: run() executes every task on the calling thread (thread 0) and
  // the workers stay asleep; the engine's SoloGovernor switches it per decode
  // step. Results are the same either way (tasks never depend on their thread).
  void set_solo(bool on) { solo_ = on; }

  template <typename F>
  void run(size_t n_tasks, F&& fn) {
    if (n_threads_ == 1 || n_tasks <= 1 || solo_) {
      for (size_t i = 0; i < n_tasks; ++i) fn(i, 0);
      return;
    }
    auto thunk = [](void* ctx, size_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); };
    dispatch(thunk, &fn, n_tasks);
  }

 private:
  using Thunk = void (*)(void*, size_t, int);
  // The unclaimed tasks [front, back) of one thread's range and the job's
  // generation tag, packed in one word (tag 24 bits | front 20 | back 20) so
  // that the owner (front) and thieves (back) claim with one CAS each, and only
  // within the job they were woken for.
  struct alignas(64) Range {
    std::atomic<uint64_t> fb{0};
  };
  static constexpr uint64_t kMaxTasks = (uint64_t(1) << 20) - 1;  // per dispatch (20-bit back)
  void dispatch(Thunk thunk, void* ctx, size_t n_tasks);
  void worker(int id);
  void work(int id, uint32_t tag);
  bool claim(int k, uint32_t tag, bool front, size_t* task);
  void run_task(size_t task, int id);

  int n_threads_;
  bool solo_ = false;  // touched by thread 0 only
  std::vector<std::thread> threads_;
  std::unique_ptr<Range[]> ranges_;
  // The current job; written by thread 0 before the ranges are published and
  // stable until its last task completes (a claim proves the job is running).
  std::atomic<Thunk> thunk_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<size_t> n_tasks_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<size_t> done_{0};  // completed tasks of the current job
  std::atomic<bool> stop_{false};
};

}  // namespace touchstone::cpu_simd
