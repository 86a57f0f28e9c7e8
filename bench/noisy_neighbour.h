// noisy_neighbour.h - a bounded background CPU load for touchstone_bench's
// --noisy-neighbour mode (decode threading must survive a busy machine).
//
// One thread, pinned to the last online CPU, alternating integer arithmetic with
// a sweep over a 32 MiB buffer (so it competes for the core and for memory
// bandwidth, like a neighbour's job), started by the constructor and stopped by
// the destructor, and never running longer than `max_seconds` even if the
// benchmark hangs. The decode threads are not pinned: the OS shares the cores.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace touchstone::bench {

class NoisyNeighbour {
 public:
  explicit NoisyNeighbour(double max_seconds = 300.0) : buf_(size_t(32) << 17, 1) {
    thread_ = std::thread([this, max_seconds] { run(max_seconds); });
  }
  ~NoisyNeighbour() {
    stop_.store(true);
    thread_.join();
  }
  NoisyNeighbour(const NoisyNeighbour&) = delete;
  NoisyNeighbour& operator=(const NoisyNeighbour&) = delete;

  // The CPU it was pinned to (-1: pinning failed, it runs wherever the OS puts it).
  int cpu() const { return cpu_.load(); }

 private:
  void run(double max_seconds) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(int(n > 0 ? n - 1 : 0), &set);
    cpu_.store(pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0 ? int(n - 1) : -1);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_seconds);
    uint64_t acc = 0x9e3779b97f4a7c15ull;
    while (!stop_.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < end) {
      for (int i = 0; i < 200000; ++i) acc = acc * 6364136223846793005ull + 1442695040888963407ull;
      for (size_t i = 0; i < buf_.size(); i += 8) acc += buf_[i];  // one sweep: 32 MiB read
    }
    sink_.store(acc);
  }

  std::vector<uint64_t> buf_;
  std::atomic<bool> stop_{false};
  std::atomic<int> cpu_{-1};
  std::atomic<uint64_t> sink_{0};
  std::thread thread_;
};

}  // namespace touchstone::bench
