// touchstone/harness/consistency.h - checks that need no golden (issue: detection power).
//
// A backend must agree with itself: the same tokens give the same logits however
// they reach the KV cache. Each check compares logits rows of one token sequence
// (a case's prompt + its golden greedy continuation):
//   consistency.prefill_vs_decode  all-position prefill (TS_CAP_ALL_POSITION_LOGITS;
//                                  else the last position only) vs token-by-token decode
//   consistency.chunked_prefill    prefill in chunks of 1, 3, 7 and 64 tokens (and the
//                                  backend's static shape buckets): logits at every
//                                  chunk end vs decode
//   consistency.rewind_replay      a dirty session (unrelated tokens, rewind(0)) and a
//                                  rewind to the middle replay the sequence: vs a fresh one
//   consistency.threads            1, 2 and 3 threads
//   consistency.run_to_run         the same sequence twice in fresh sessions
// A backend that claims TS_CAP_BITWISE_DETERMINISM must give identical bits in
// rewind_replay, threads and run_to_run; otherwise (and always in the other two
// checks, where the computation order legitimately differs) rows must agree within
// the profile's logits_nmse_max / logits_max_abs_max and have the same argmax
// unless the top-2 margin is below near_tie_margin.
#pragma once

#include <span>
#include <vector>

#include "touchstone/golden/manifest.h"
#include "touchstone/harness/parity.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

struct ConsistencyOptions {
  BackendSessionOptions session;  // weight path, threads, max_context of the run
  bool bitwise = false;           // the backend claims TS_CAP_BITWISE_DETERMINISM
  bool all_positions = false;     // TS_CAP_ALL_POSITION_LOGITS
  std::vector<int32_t> buckets;   // static prefill shapes (TS_CAP_STATIC_SHAPES), may be empty
};

// One CaseResult per check, named "consistency.<check>", failures naming the
// check, the position and the metric. Backend errors propagate (BackendError).
std::vector<CaseResult> check_consistency(const BackendModel& model,
                                          std::span<const int32_t> tokens, const Profile& profile,
                                          const ConsistencyOptions& opt);

}  // namespace touchstone
