#include "thread_pool.h"

#include <immintrin.h>

namespace ts_cpu {

namespace {
constexpr int kSpin = 4000;  // pause iterations (~10-50 us) before sleeping
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : 1) {
  threads_.reserve(size_t(n_threads_));
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::work(int id) {
  // Contiguous ranges: a thread streams one contiguous run of weight rows, which
  // the hardware prefetchers follow (round-robin chunks broke the streams).
  const size_t n = size_t(n_threads_);
  const size_t b = n_tasks_ * size_t(id) / n, e = n_tasks_ * (size_t(id) + 1) / n;
  for (size_t i = b; i < e; ++i) thunk_(ctx_, i, id);
}

void ThreadPool::dispatch(Thunk thunk, void* ctx, size_t n_tasks) {
  thunk_ = thunk;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  work(0);
  // Spin briefly, then sleep: on an oversubscribed machine a worker may not be
  // running, and spinning would only steal its core.
  int p = pending_.load(std::memory_order_acquire);
  for (int spin = 0; p != 0 && spin < kSpin; ++spin) {
    _mm_pause();
    p = pending_.load(std::memory_order_acquire);
  }
  while (p != 0) {
    pending_.wait(p, std::memory_order_acquire);
    p = pending_.load(std::memory_order_acquire);
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
    work(id);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace ts_cpu
