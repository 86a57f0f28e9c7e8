#include "thread_pool.h"

#include <immintrin.h>

#include <algorithm>

namespace touchstone::cpu_simd {

namespace {
constexpr int kSpin = 4000;  // pause iterations (~10-50 us) before sleeping
constexpr uint64_t kTagMask = (uint64_t(1) << 24) - 1, kIdxMask = (uint64_t(1) << 20) - 1;
constexpr uint64_t pack(uint64_t tag, uint64_t front, uint64_t back) {
  return (tag & kTagMask) << 40 | front << 20 | back;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads > 0 ? n_threads : 1), ranges_(new Range[size_t(n_threads_)]) {
  threads_.reserve(size_t(n_threads_));
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

// Claims the front (owner) or back (thief) task of range k, only while the
// range still belongs to job `tag`.
bool ThreadPool::claim(int k, uint32_t tag, bool front_end, size_t* task) {
  std::atomic<uint64_t>& fb = ranges_[size_t(k)].fb;
  uint64_t v = fb.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t t = v >> 40, front = (v >> 20) & kIdxMask, back = v & kIdxMask;
    if (t != (tag & kTagMask) || front >= back) return false;
    const uint64_t next = front_end ? pack(t, front + 1, back) : pack(t, front, back - 1);
    if (fb.compare_exchange_weak(v, next, std::memory_order_acq_rel)) {
      *task = size_t(front_end ? front : back - 1);
      return true;
    }
  }
}

void ThreadPool::run_task(size_t task, int id) {
  thunk_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), task, id);
  const size_t n = n_tasks_.load(std::memory_order_relaxed);
  if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) done_.notify_one();
}

void ThreadPool::work(int id, uint32_t tag) {
  size_t task;
  while (claim(id, tag, true, &task)) run_task(task, id);
  // Own range done: steal the others' remaining tasks from the back.
  for (int j = 1; j < n_threads_; ++j) {
    const int k = (id + j) % n_threads_;
    while (claim(k, tag, false, &task)) run_task(task, id);
  }
}

void ThreadPool::dispatch(Thunk thunk, void* ctx, size_t n_tasks) {
  for (size_t base = 0; base < n_tasks; base += kMaxTasks) {
    const size_t n_job = std::min<size_t>(kMaxTasks, n_tasks - base);
    struct Offset {
      Thunk thunk;
      void* ctx;
      size_t base;
    } off{thunk, ctx, base};
    thunk_.store(base == 0 ? thunk : [](void* c, size_t t, int th) {
      const auto* o = static_cast<const Offset*>(c);
      o->thunk(o->ctx, o->base + t, th);
    }, std::memory_order_relaxed);
    ctx_.store(base == 0 ? ctx : &off, std::memory_order_relaxed);
    n_tasks_.store(n_job, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint32_t tag = generation_.load(std::memory_order_relaxed) + 1;
    const size_t n = size_t(n_threads_);
    for (size_t k = 0; k < n; ++k) {
      ranges_[k].fb.store(pack(tag, n_job * k / n, n_job * (k + 1) / n), std::memory_order_release);
    }
    generation_.store(tag, std::memory_order_release);
    generation_.notify_all();
    work(0, tag);
    // Wait for the tasks still running on other threads (none may be left
    // unclaimed: work() stole them). Spin briefly, then sleep.
    size_t d = done_.load(std::memory_order_acquire);
    for (int spin = 0; d != n_job && spin < kSpin; ++spin) {
      _mm_pause();
      d = done_.load(std::memory_order_acquire);
    }
    while (d != n_job) {
      done_.wait(d, std::memory_order_acquire);
      d = done_.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::worker(int id) {
  uint32_t seen = 0;
  for (;;) {
    // Spin for a while (~tens of microseconds), then sleep until the next job.
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpin; ++spin) {
      _mm_pause();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    work(id, g);  // claims fail at once if this job is already over
  }
}

}  // namespace touchstone::cpu_simd
