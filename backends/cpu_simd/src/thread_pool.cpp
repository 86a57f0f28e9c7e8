#include "thread_pool.h"

#include <immintrin.h>

namespace ts_cpu {

namespace {
constexpr int kSpin = 4000;  // pause iterations (~10-50 us) before sleeping
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

namespace {
constexpr uint64_t pack(uint64_t front, uint64_t back) { return front << 32 | back; }
}  // namespace

bool ThreadPool::claim_front(int k, size_t* task) {
  std::atomic<uint64_t>& fb = ranges_[size_t(k)].fb;
  uint64_t v = fb.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t front = v >> 32, back = v & 0xffffffffu;
    if (front >= back) return false;
    if (fb.compare_exchange_weak(v, pack(front + 1, back), std::memory_order_acq_rel)) {
      *task = size_t(front);
      return true;
    }
  }
}

bool ThreadPool::claim_back(int k, size_t* task) {
  std::atomic<uint64_t>& fb = ranges_[size_t(k)].fb;
  uint64_t v = fb.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t front = v >> 32, back = v & 0xffffffffu;
    if (front >= back) return false;
    if (fb.compare_exchange_weak(v, pack(front, back - 1), std::memory_order_acq_rel)) {
      *task = size_t(back - 1);
      return true;
    }
  }
}

void ThreadPool::work(int id) {
  size_t task;
  while (claim_front(id, &task)) thunk_(ctx_, task, id);
  // Own range done: steal the others' remaining tasks from the back.
  for (int j = 1; j < n_threads_; ++j) {
    const int k = (id + j) % n_threads_;
    while (claim_back(k, &task)) thunk_(ctx_, task, id);
  }
}

void ThreadPool::dispatch(Thunk thunk, void* ctx, size_t n_tasks) {
  thunk_ = thunk;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  const size_t n = size_t(n_threads_);
  for (size_t k = 0; k < n; ++k) {
    ranges_[k].fb.store(pack(n_tasks * k / n, n_tasks * (k + 1) / n), std::memory_order_relaxed);
  }
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
