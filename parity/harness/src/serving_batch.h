// serving_batch.h - the batch shapes of serving.batch_invariance and
// serving.content_isolation (serving_batch_shape.cpp): which sequences share a
// step_batch call, how each is fed and at which slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "touchstone/harness/serving.h"

namespace touchstone::detail {

enum class Schedule { kNeedleDecodes, kNeedlePrefills };

// A run of a sequence's tokens fed in one entry; `all`: all-position logits
// (a draft verification).
struct Feed {
  size_t begin = 0, n = 0;
  bool all = false;
};

// One sequence: its tokens and how they are fed, one feed per step from
// `start_step` on.
struct Seq {
  std::string name;  // "the needle", "filler 2"
  std::vector<int32_t> tokens;
  std::vector<Feed> feeds;
  int start_step = 0;
};

// The needle as the batch checks feed it: the short one (prompt + golden
// continuation) decodes, the long one (extended) prefills.
struct Needles {
  std::span<const int32_t> short_needle, long_needle;
  size_t prompt_len = 0;
};

// The sequences of one schedule: [0] the needle, then n_fillers fillers. The
// feeds (lengths, chunks, all-position entries) follow the plan's seed only;
// the fillers' tokens follow `content`, so two contents give the same shapes.
//   kNeedleDecodes: the needle prefills its prompt, then decodes one token per
//     step; filler f (filler_lengths[f mod n] tokens) prefills in as many seeded
//     chunks as the needle has steps.
//   kNeedlePrefills: fillers prefill a short prompt at step 0, then decode one
//     token per step; from step 1 the long needle prefills in seeded chunks.
// In both, a feed of 2..verify_max tokens is an all-position entry half of the
// time (fillers' decode steps: a third of them verify 1..verify_max-1 drafts)
// when the backend has all-position logits.
std::vector<Seq> make_cast(Schedule s, const Needles& needles, const ServingPlan& plan,
                           size_t n_fillers, bool all_positions, uint64_t content, int32_t n_vocab);

// One batch configuration: B sequences, a schedule, the needle's slot (the
// fillers take the other slots in order).
struct Shape {
  int batch = 0;
  Schedule schedule = Schedule::kNeedleDecodes;
  int needle_slot = 0;
  std::string label() const;
  // The cast member (make_cast index) at `slot`.
  size_t cast_at(int slot) const;
};

// The plan's shapes: every B (over max_batch left out) with both schedules;
// the needle at slot (shape index mod B), so that over the plan it visits
// every slot of the first shapes' batches.
std::vector<Shape> batch_shapes(const ServingOptions& o);

const char* schedule_name(Schedule s);

}  // namespace touchstone::detail
