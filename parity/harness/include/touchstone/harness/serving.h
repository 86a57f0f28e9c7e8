// touchstone/harness/serving.h - golden-free checks of a backend as engines serve
// (ABI v6 step_batch / fork_session; docs/serving-checks.md).
//
// The needle is one manifest case: its prompt and its golden greedy
// continuation (teacher-forced); the long needle extends it with the other
// cases' tokens (ServingOptions::extension, then seeded ids) to
// needle_length tokens. Four checks, one CaseResult each:
//   serving.batch_invariance    batches of B sequences (the needle and B-1
//                               seeded fillers) in two schedules: the needle
//                               decodes while long fillers prefill in chunks,
//                               and the long needle prefills in chunks while
//                               short fillers decode; some entries verify drafts
//                               (all positions). EVERY entry is compared with its
//                               own sequence run alone, fed the same way through
//                               prefill / decode / all-position prefill; the
//                               needle's slot moves from shape to shape
//   serving.content_isolation   the largest B's shapes with other filler contents:
//                               the needle's rows must not move (bitwise for a
//                               backend claiming TS_CAP_BITWISE_DETERMINISM, else
//                               within 4x the drift between two identical runs)
//   serving.prefix_fork         fork the source at several points, continue each
//                               fork with its own suffix (other than the source's
//                               and its siblings'), continue the source, then every
//                               fork again: each against a fresh session fed the
//                               same tokens (aliased, copy-on-write or refcounted
//                               KV rows show)
//   serving.speculative_verify  for K in draft_lengths: drafts from the golden
//                               continuation with a seeded wrong token, verified by
//                               one all-position prefill, the agreeing prefix
//                               accepted, rewind; then every K at once, each a
//                               session verifying in one step_batch call: the
//                               tokens must equal the backend's own greedy decode,
//                               and the verify rows its decode rows
// Bits are demanded where the backend claims them: TS_CAP_BATCH_INVARIANT for
// this weight path (every comparison across batch company, chunking or a fork),
// TS_CAP_BITWISE_DETERMINISM (the same calls again, content_isolation); every
// other comparison uses the profile's logits_nmse_max / logits_max_abs_max and
// the near-tie rule, and the measured drift is reported per batch shape
// (CaseResult::drift). Failures name the check, the batch size, the schedule,
// the entry's slot and sequence and the first failing position.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "touchstone/golden/manifest.h"
#include "touchstone/harness/parity.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

// The sizes of the serving checks. quick(): CI on every backend, the scalar
// reference included; full(): the sizes of docs/serving-checks.md.
struct ServingPlan {
  std::vector<int> batch_sizes;  // B: sequences per step_batch call, needle included
  // Sequences long enough to cross KV pages and kernel tiles: the long needle
  // (needle-prefills schedule) and the fillers of the needle-decodes schedule,
  // which take these lengths in turn.
  int32_t needle_length = 264;
  std::vector<int32_t> filler_lengths;
  int32_t filler_min = 10;  // short fillers' prompts (needle-prefills schedule), seeded
  int32_t filler_max = 32;
  int32_t verify_max = 9;  // an all-position entry: 2..verify_max tokens (1..verify_max-1 drafts)
  int decode_steps = 16;   // needle decode steps (capped by its continuation)
  std::vector<int> draft_lengths;  // K of speculative_verify
  uint64_t seed = 0x5e7f1ce5ull;
  // smoke: B = 3, sequences up to 72 tokens, 8 needle steps, K = 4 (the quick
  // suite of ci/parity: every check once, every batch shape kind once).
  static ServingPlan smoke();
  static ServingPlan quick();
  static ServingPlan full();
  // "smoke", "quick" or "full"; throws Error for another name.
  static ServingPlan named(const std::string& name);
  // The most positions any session of the plan holds, for a needle of n tokens.
  int32_t context_needed(size_t needle_tokens) const;
};

struct ServingOptions {
  BackendSessionOptions session;
  bool bitwise = false;  // TS_CAP_BITWISE_DETERMINISM
  // TS_CAP_BITWISE_DETERMINISM without TS_CAP_BITWISE_NOT_ACROSS_FORKS: the
  // claim extends to a fork (and its source) against a fresh session.
  bool fork_bitwise = false;
  bool batch_invariant = false;  // TS_CAP_BATCH_INVARIANT covering session.weight_path
  bool all_positions = false;    // TS_CAP_ALL_POSITION_LOGITS (speculative_verify needs it)
  int32_t max_batch = 0;         // ts_capabilities.max_batch (0 = no limit)
  ServingPlan plan;
  // Text to extend the needle with (the manifest's other cases' prompt and
  // golden tokens); seeded ids fill up what it lacks.
  std::vector<int32_t> extension;
  std::vector<std::string> checks;  // names of serving_check_names() to run; empty = all
  // Layer taps (ABI v4) naming the first divergent layer of a failing batch
  // or fork comparison: floats of one record (n_layer * TS_TAP_POINTS *
  // n_embd), n_embd, and the NMSE tolerance per tap where bits are not
  // claimed. tap_floats 0: not located (no taps, or no layer tolerance).
  size_t tap_floats = 0, tap_dim = 0;
  double layer_tolerance = 0.0;
  bool runs(const std::string& check) const;
  size_t n_checks() const;  // how many of the four run
  // Whether the plan's batches of b sequences run (b >= 2, at most max_batch).
  bool runs_batch(int b) const;
  // Why a check compared no rows: it is NOT SUPPORTED with this reason, never PASS.
  std::string no_rows_reason() const;
};

// The flags above from a backend's capabilities, for one weight path.
ServingOptions serving_options(const ts_capabilities& caps, const BackendSessionOptions& session,
                               ServingPlan plan);

// Runs the four checks on the needle (prompt + golden continuation).
// Backend errors propagate (BackendError), as in check_consistency.
std::vector<CaseResult> check_serving(const BackendModel& model, std::span<const int32_t> prompt,
                                      std::span<const int32_t> continuation, const Profile& profile,
                                      const ServingOptions& opt);

// The names of the four checks, in order ("serving.batch_invariance", ...).
const std::vector<std::string>& serving_check_names();

}  // namespace touchstone
