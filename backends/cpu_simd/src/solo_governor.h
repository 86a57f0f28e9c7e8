// solo_governor.h - picks, per decode step, whether the pool's workers take
// part (parallel) or thread 0 runs alone (solo), from measured step times.
//
// Why (2 threads must never be slower than 1 on a busy machine):
// with a neighbour on one of two cores, three threads share two cores, and
// thread 0 (which dispatches every one of the ~180 jobs of a token) lands on
// the busy core part of the time; measured on a 2-core Xeon, 2-thread decode
// then ran at 0.81x of 1-thread decode although no single wait for a worker
// was long. The cause is the schedule, not one kernel, so the governor judges
// the outcome: it keeps the last wall times of a decode step in each mode
// (their median is the mode's time), runs the faster mode, and probes the other one
// every `explore_every()` steps (rarely while parallel is far ahead, so a quiet
// machine pays ~1 %), or at once when the preferred mode became 20 % slower
// than at the last probe; a probe that wins is repeated at once, and the mode
// changes after three fresh probes whose median wins by more than 3 %.
// Decode steps of one model are alike (one token; the context grows by one
// per step), so their times compare directly. Prefill is not governed.
// A mode's time is the median of its last kSamples steps: one step that the
// OS interrupted does not flip the choice. The machine's load outlives a
// session, so the engine keeps one governor per (model, thread count), shared
// by the sessions of that model (engine.h: SimdModel::governor).
//
// Not thread-safe: the caller serializes choose() and record().
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace touchstone::cpu_simd {

class SoloGovernor {
 public:
  // The mode for the next step: true = solo.
  bool choose() {
    ++step_;
    const bool other = !solo_preferred_;
    if (samples_[solo_preferred_].n == 0) return solo_preferred_;  // measure both modes first
    if (samples_[other].n == 0 || confirm_) return other;
    if (!slowed_ && step_ % uint64_t(explore_every()) != 0) return solo_preferred_;
    samples_[other] = Samples{};  // a fresh probe: old samples of that mode are stale
    slowed_ = false;
    ref_ = median(solo_preferred_);
    return other;
  }
  // Records the wall time (any unit) of a step run in `solo` mode.
  void record(bool solo, double time) {
    Samples& r = samples_[solo];
    r.t[r.next++ % kSamples] = time;
    r.n = std::min(r.n + 1, kSamples);
    confirm_ = false;
    if (solo == solo_preferred_) {
      // The preferred mode became 20 % slower than at the last probe (a
      // neighbour arrived): probe the other one now rather than at the next interval.
      if (ref_ == 0.0 || r.n < kSamples) ref_ = median(solo);
      slowed_ = median(solo) > ref_ * 1.2;
      return;
    }
    if (samples_[solo_preferred_].n == 0) return;
    // A probe of the other mode. It takes over only when kConfirm fresh probes
    // in a row have a median below the preferred mode's by the hysteresis; a
    // probe that wins is repeated at once, one that loses ends the probing.
    const double bar = median(solo_preferred_) * (1.0 - kHysteresis);
    if (time >= bar) return;
    if (r.n >= kConfirm && median(solo) < bar) {
      solo_preferred_ = solo;
      return;
    }
    confirm_ = true;
  }
  bool solo_preferred() const { return solo_preferred_; }
  // Steps between two probes of the mode not preferred: 64 while parallel is
  // well ahead (a solo probe on a quiet machine costs about one step), 16
  // while solo is preferred or the two are close (a neighbour that leaves is
  // noticed within 16 steps).
  int explore_every() const {
    const bool other = !solo_preferred_;
    if (samples_[0].n == 0 || samples_[1].n == 0) return 1;
    if (solo_preferred_ || median(other) < median(solo_preferred_) * 1.25) return 16;
    return 64;
  }
  // The median of a mode's last step times (0 before its first step).
  double mean(bool solo) const { return samples_[solo].n ? median(solo) : 0.0; }

 private:
  static constexpr size_t kSamples = 5;
  static constexpr size_t kConfirm = 3;
  static constexpr double kHysteresis = 0.03;
  struct Samples {
    std::array<double, kSamples> t{};
    size_t n = 0, next = 0;
  };
  double median(bool solo) const {
    const Samples& r = samples_[solo];
    std::array<double, kSamples> v{};
    for (size_t i = 0; i < r.n; ++i) v[i] = r.t[(r.next - 1 - i) % kSamples];
    std::nth_element(v.begin(), v.begin() + r.n / 2, v.begin() + r.n);
    return v[r.n / 2];
  }
  bool solo_preferred_ = false;
  bool confirm_ = false;
  bool slowed_ = false;
  double ref_ = 0.0;  // the preferred mode's median when the last probe began
  Samples samples_[2];
  uint64_t step_ = 0;
};

}  // namespace touchstone::cpu_simd
