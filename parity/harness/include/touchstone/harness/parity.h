// touchstone/harness/parity.h - compares one backend session with the goldens.
//
// Greedy check (per case): the backend prefills the golden prompt ids, then at
// every step s its argmax is compared with greedy_ids[s] and the golden token
// is fed back (teacher forcing), so every step is compared on the same prefix.
// A differing argmax is accepted only under the near-tie rule (docs/metrics.md);
// the first unaccepted one ends the case with a first-divergence report.
// Logits at every step are compared against the profile: NMSE and max-abs on
// the full row for the first n_full_steps steps, on the stored top-K ids after;
// KL divergence from the stored top-K + log-sum-exp.
// A top-N backend (BackendSession::top_n_logprobs() > 0, a llama-server over HTTP):
// greedy and top-1 as above, KL as the lower bound over the returned top-N
// (docs/metrics.md#top-n-backends), NMSE / max-abs NOT SUPPORTED.
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "touchstone/golden/golden.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/metrics/metrics.h"
#include "touchstone/model/tokenizer.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

struct GreedyDivergence {
  int step = 0;  // index into greedy_ids
  int32_t ref_id = 0, test_id = 0;
  std::string ref_text, test_text;  // decoded bytes of each token
  double ref_margin = 0.0;          // reference top-1 minus top-2 logit at this step
  bool accepted = false;            // near-tie rule
  bool test_in_ref_topk = false, ref_in_test_topk = false;
};

// The first layer tap (golden format 2, backend with ABI v4 taps) whose NMSE
// against the reference exceeds the profile's layer tolerance: the earliest
// tap step, then the lowest layer, then attention output < FFN output <
// residual. Points: "attention output", "FFN output", "residual".
struct LayerDivergence {
  int step = 0, layer = 0, point = 0;
  double nmse = 0.0, tolerance = 0.0;
  // The routing diagnosis (touchstone/run/moe_routing.h), when the point is an FFN
  // output of a mixture-of-experts layer ("routing divergence at step 0, layer 1: ...",
  // "routing agrees at ..."); "" = none.
  std::string explanation;
  std::string point_name() const;
  std::string describe() const;  // "layer 3, attention output: NMSE 3.1e-02 > 1.0e-09 (step 0)"
};

// One compared greedy step, for the report's per-step series (docs/report-format.md).
// Non-finite values stay as they are (the JSON writes them as null).
struct StepPoint {
  bool top1_match = false;  // backend argmax == golden greedy token
  double ref_margin = 0.0;  // reference top-1 minus top-2 logit (stored top-K); NaN if K < 2
  double kl = 0.0;          // top-K KL estimate (nats)
  double nmse = 0.0;        // full row for the first full_row_steps steps, stored top-K ids after
  double max_abs = 0.0;     // on the same entries as nmse
};

// One scored position of a passage (the logits predicting token i + 1).
struct PositionPoint {
  bool top1_match = false;  // backend argmax == reference top-1
  double kl = 0.0;          // top-K KL estimate (nats)
  double nmse = 0.0;        // over the stored top-K ids of this position
  double max_abs = 0.0;     // over the same ids
};

// One violated criterion, by name, so a reviewed known divergence
// (touchstone/harness/known_divergence.h) can say which violations it expects.
// check: a profile criterion: "logits_nmse", "logits_max_abs" (worst over the
// compared steps / top-K entries), "kld_mean", "kld_p99", "top1_agreement",
// "ppl_ratio" (value: max(ratio, 1/ratio)), "greedy" (value: the step of the
// first unaccepted argmax flip); or one no known divergence may cover:
// "backend_error", "non_finite", "device_greedy", "known_divergence".
struct Violation {
  std::string check;
  double value = 0.0;
  double limit = 0.0;  // the profile's threshold (0 for the uncoverable kinds)
};

// A failure that matched a reviewed known_divergence entry within its accepted
// values (touchstone/harness/known_divergence.h): the result counts as expected.
struct KnownDivergenceMatch {
  struct Check {
    std::string check;
    double value = 0.0;     // this run
    double measured = 0.0;  // when the entry was written
    double accept = 0.0;    // the entry's bound (<=, or >= for top1_agreement / greedy)
  };
  std::string id, why, reviewed_by, measured_on, source;  // source: "file, entry N"
  std::vector<Check> checks;
};

// One configuration of a serving check (touchstone/harness/serving.h) and the drift it
// measured: the needle's rows there vs the run it is compared with.
struct DriftPoint {
  std::string label;  // "B=4, fillers prefill while the needle decodes, needle in slot 2"
  int size = 0;       // batch_invariance / content_isolation: B; prefix_fork: n_prefix;
                      // speculative_verify: K
  int rows = 0;       // rows compared
  double nmse_max = 0.0, max_abs = 0.0;
  bool bitwise = true;  // every compared row identical bit for bit
};

struct CaseResult {
  std::string name;
  bool passed = false;
  std::vector<std::string> failures;                 // one line per violated criterion
  int n_steps = 0;                                   // steps compared
  int n_total = 0;                                   // golden steps
  int n_matched = 0;                                 // steps whose argmax equals the golden token
  std::optional<GreedyDivergence> first_divergence;  // first differing argmax (accepted or not)
  std::vector<GreedyDivergence> near_ties;           // accepted divergences
  int first_unaccepted_flip_step = -1;               // first differing argmax not a near-tie
  int first_logit_violation_step = -1;               // first step whose logits break the profile
  std::string first_logit_violation;                 // what broke there
  int tap_steps_compared = 0;                        // golden tap steps compared (0 = no taps)
  // The backend's tap records of those steps, [tap_steps_compared][n_layer][TS_TAP_POINTS]
  // [n_embd] float32, for the routing diagnosis of a mixture-of-experts model.
  std::vector<float> backend_taps;
  // That diagnosis over every compared step and layer ("" = not a mixture-of-experts
  // model, or no taps): "routing as the reference's at 6 of 6 (step, layer) pairs ...".
  std::string routing;
  std::optional<LayerDivergence> first_layer_divergence;
  // Serving checks: where the first failing row's layer taps were compared
  // (" at position N (<shape, slot, ...>)"; "" = not located, no taps).
  std::string layer_locus;
  std::string layer_not_located;  // why the taps of that failure could not be read
  double nmse_max = 0.0;          // over compared steps
  double max_abs = 0.0;           // over compared steps
  double kld_mean = 0.0, kld_max = 0.0;
  size_t nonfinite = 0;         // NaN/Inf logits seen
  int device_greedy_steps = 0;  // steps re-run through prefill_greedy (TS_CAP_DEVICE_GREEDY)
  // Non-empty when a backend call failed (error status, crash, exit, time-out,
  // protocol violation): where and why. The session is unusable afterwards.
  std::string backend_error;
  // Structured output (a case with a grammar): who applied the grammar's mask,
  // "applied by the harness" (to the backend's logits) or "enforced by the
  // backend"; "" = the case has no grammar (docs/structured-output.md).
  std::string grammar_enforcement;
  int first_mask_difference_step = -1;  // first step whose allowed set differs from the golden's
  double seconds = 0.0;
  std::vector<StepPoint> series;      // one per compared step (greedy cases; empty otherwise)
  int full_row_steps = 0;             // series steps whose NMSE / max-abs cover the full row
  double kld_p99 = 0.0;               // over compared steps
  std::vector<Violation> violations;  // one per violated criterion (failures has the text)
  // Set when the failure is a reviewed known divergence (passed stays false).
  std::optional<KnownDivergenceMatch> known_divergence;
  bool acceptable() const { return passed || known_divergence.has_value(); }
  // A top-N backend (ABI v5 TS_CAP_TOP_N_LOGPROBS): N, else 0. Its KL is the
  // lower bound metrics::kl_divergence_topn, NMSE / max-abs are not computed
  // (nmse_max, max_abs and the series' nmse / max_abs are NaN) and every
  // profile check that needs full rows is named in not_supported.
  int logprobs_top_n = 0;
  std::vector<std::string> not_supported;  // "logits_nmse", "logits_max_abs", ...
  // multimodal.encoder (an image case on a backend with its own vision tower, ABI v8
  // TS_CAP_MULTIMODAL; docs/vision.md): the backend's image embeddings against the
  // golden's (NaN = not run); the case is then judged again with them in the prompt.
  double encoder_nmse = NAN, encoder_max_abs = NAN;
  // Who preprocessed the image for it: "the harness" (the pixel tensor went in) or "the
  // backend" (it took the decoded image, TS_IMAGE_RGB8); "" = not run.
  std::string encoder_preprocessing;
  // multimodal.preprocess (ABI v9 preprocess_image; docs/vision.md): the backend's pixel
  // tensor against the processor's: NMSE, max |diff| and max |diff| in 8-bit levels (NaN =
  // not run); preprocess_shape: the backend's shape and the processor's when they differ.
  double preprocess_nmse = NAN, preprocess_max_abs = NAN, preprocess_max_levels = NAN;
  std::string preprocess_shape;
  // A failing tensor of the right shape: the filter with which the processor reproduces it
  // ("" = none; PreprocessCheck::matching_filter).
  std::string preprocess_matching_filter;
  int topn_missing_max = 0;       // most reference top-K tokens absent from one returned row
  std::vector<DriftPoint> drift;  // serving checks: one per configuration run
};

struct ScoringResult {
  std::string name;
  bool passed = false;
  std::vector<std::string> failures;
  metrics::ScoringStats stats{};
  double topk_nmse = 0.0;     // NMSE over all stored top-K logits
  double topk_max_abs = 0.0;  // max |diff| over all stored top-K logits
  // First position whose row is out of the profile (top-K NMSE / max-abs,
  // non-finite, or a top-1 flip beyond the near-tie margin); -1 = none.
  int first_failing_position = -1;
  std::string first_failing;
  std::string backend_error;  // as in CaseResult
  double seconds = 0.0;
  std::vector<PositionPoint> series;  // one per scored position
  std::vector<Violation> violations;  // as in CaseResult
  std::optional<KnownDivergenceMatch> known_divergence;
  bool acceptable() const { return passed || known_divergence.has_value(); }
};

// Called after every compared step / scored position with (done, total), for
// progress displays; never affects the verdict.
using ProgressFn = std::function<void(int done, int total)>;

// Neither function throws for anything the backend does: a failing call
// becomes a failure naming the step/position and the call, and sets
// backend_error so the caller replaces the session before the next case.
// max_steps > 0: compare only the first max_steps greedy steps (a quick suite).
CaseResult check_case(BackendSession& session, const Tokenizer& tok, const GoldenCase& golden,
                      const Profile& profile, int max_steps = 0, const ProgressFn& progress = {});

// max_positions > 0: score only the first max_positions positions of the passage.
ScoringResult check_scoring(BackendSession& session, const GoldenScoring& golden,
                            const Profile& profile, bool all_position_logits, int max_positions = 0,
                            const ProgressFn& progress = {});

}  // namespace touchstone
