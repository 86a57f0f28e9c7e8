// touchstone/metrics/metrics.h - the parity metrics.
//
// Everything a parity verdict is computed from lives here. Conventions:
//  * All accumulation is in double, in a fixed order (index ascending), so a
//    result is bit-reproducible for given inputs.
//  * Natural logarithms everywhere: KL divergences and NLLs are in nats.
//  * Invalid arguments (empty inputs, mismatched sizes, k <= 0, ids out of
//    range, duplicate ids) throw touchstone::Error naming the argument and the
//    sizes involved.
//  * Non-finite values (NaN, +-Inf) on the side under test are never silently
//    accepted: KL, NMSE and max-abs-diff become +inf (so any `x <= tol` check
//    fails). Non-finite values in a *reference* distribution (golden top-K
//    logits / lse) throw Error: that is a corrupt golden, not a backend bug.
//
// Formulas and their sources are given per function; docs/metrics.md has the
// derivations (in particular the error bound of the top-K KL estimate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace touchstone::metrics {

// Returned by argmax() for a row whose entries are all NaN. Never a valid id,
// so it compares unequal to every reference token.
inline constexpr int32_t kNoToken = -1;

// Index of the largest logit. Ties -> lowest id (the reference greedy rule).
// NaN never wins: NaN entries are skipped; a row of only NaN returns kNoToken.
// +Inf is an ordinary (largest) value. Throws Error on empty input.
int32_t argmax(std::span<const float> logits);

struct TopK {
  std::vector<int32_t> ids;   // ranked: descending value, ties -> lower id
  std::vector<float> values;  // values[i] == logits[ids[i]]
};

// The k largest logits, ranked by (value descending, id ascending) - a total,
// deterministic order. NaN ranks below every number (after -Inf), NaNs among
// themselves by id. k is clipped to logits.size(). Throws Error if k <= 0 or
// logits is empty.
TopK top_k(std::span<const float> logits, int k);

// log(sum_i exp(x_i)), computed as m + log(sum_i exp(x_i - m)) with
// m = max_i x_i, the sum in double, index ascending. Special values:
// any NaN -> NaN; any +Inf -> +Inf; all -Inf -> -Inf. Throws Error on empty.
double log_sum_exp(std::span<const float> logits);

bool all_finite(std::span<const float> values);
size_t count_nonfinite(std::span<const float> values);  // NaN and +-Inf

// Normalized mean squared error, as in llama.cpp tests/test-backend-ops.cpp
// (nmse()):  sum_i (r_i - t_i)^2 / sum_i r_i^2   (differences taken in double).
// Dimensionless. Sizes must match and be non-zero (Error).
// Any NaN or Inf in either input -> +inf. All-zero ref: 0 if test is also all
// zero, else +inf.
double nmse(std::span<const float> ref, std::span<const float> test);

// max_i |r_i - t_i| in double. Sizes must match and be non-zero (Error).
// Any NaN or Inf in either input -> +inf.
double max_abs_diff(std::span<const float> ref, std::span<const float> test);

// logit[top1] - logit[top2] with the top_k() ranking (so >= 0; 0 on a tie).
// Throws Error if logits.size() < 2. NaN if fewer than two non-NaN entries or
// the top two are both +Inf; a NaN margin fails every `margin < eps` test.
double top2_margin(std::span<const float> logits);

// ---------------------------------------------------------------------------
// KL divergence KL(P_ref || Q_test) = sum_i p_i (log p_i - log q_i), nats.

struct KlEstimate {
  double kl;        // the estimate KL_est (>= 0), +inf for non-finite test logits
  double p_tail;    // P_tail = 1 - sum_{i in topK} p_i, clamped to >= 0
  double q_tail;    // Q_tail = sum_{j not in topK} q_j (= 1 - sum_topK q_i)
  double kl_upper;  // rigorous upper bound on the exact KL (see below)
};

// KL of the reference distribution stored as top-K logits + lse against a full
// test row:
//   p_i = exp(r_i - lse_ref) for i in topK;  q_j = exp(t_j - lse_test),
//   lse_test = log_sum_exp(test_logits)
//   KL_est = sum_{i in topK} p_i (log p_i - log q_i) + P_tail (log P_tail - log Q_tail)
// with 0 * log 0 = 0. This is the exact KL of the two distributions
// coarse-grained to {top-K tokens, "rest"}; by the log-sum inequality
//   0 <= KL_est <= KL_true,  KL_true - KL_est = P_tail * KL(P|tail || Q|tail)
// where P|tail, Q|tail are the distributions conditioned on the tail.
// Bound (assuming the stored entries are the K largest reference logits, so
// every tail token has log p_j <= r_min - lse_ref, r_min = min stored logit):
//   KL(P|tail || Q|tail) <= max_{j in tail} log(p_j/q_j) - log(P_tail/Q_tail)
//                        <= (r_min - lse_ref) - (t_tailmin - lse_test) - log(P_tail/Q_tail)
//   kl_upper = KL_est + P_tail * max(0, that).
// Numerics: log p_i - log q_i is evaluated as (r_i - t_i) - (lse_ref - lse_test);
// Q_tail is summed directly over the tail in log space (no cancellation). If
// every stored p_i equals its q_i bit for bit the coarse distributions are
// identical and the result is exactly 0. With K == vocab the tail is empty
// and KL_est is the full KL.
// Errors: ids/logits size mismatch or empty, ids out of [0, vocab) or
// duplicated, empty test row, non-finite reference values, or a reference
// whose top-K mass exceeds 1 + 1e-3 (lse inconsistent with the logits).
// Non-finite test logits -> kl = kl_upper = +inf (tails NaN).
KlEstimate kl_divergence_topk(std::span<const int32_t> ref_topk_ids,
                              std::span<const float> ref_topk_logits, double ref_lse,
                              std::span<const float> test_logits);

// Top-N backends (ABI v5 TS_CAP_TOP_N_LOGPROBS, e.g. a llama-server): the test
// row holds log q_j for the returned set R (finite entries) and -INFINITY for
// every other token. With S = the reference's stored top-K, T = S ∩ R,
// M = S \ R (reference tokens the backend did not return), q_N = min_{j in R} q_j
// (the backend's N-th probability: every unreturned token has q <= q_N),
// U = max(1 - sum_R q, 1e-6) (unreturned mass; 1e-6 of slack for the float
// rounding of the returned probabilities), Q_out = sum_{R \ S} q:
//   KL_lb = sum_{i in T} p_i (log p_i - log q_i)
//         + min_{x in [0, min(|M| q_N, U)]} [ P_M log(P_M / x) + P_tail log(P_tail / (Q_out + U -
//         x)) ]
// (P_M = sum_{i in M} p_i, P_tail = 1 - sum_S p_i; 0 log 0 = 0; the minimum is
// at x = (Q_out + U) P_M / (P_M + P_tail) clamped to the interval). This is the
// KL of both distributions coarse-grained to {each token of T, M, not S},
// minimised over the one unknown (Q_M): by the data-processing inequality a
// rigorous LOWER bound on the exact KL (up to the 1e-6 slack), clamped at 0.
// A row with NaN / +Inf or no finite entry -> kl = +inf.
struct TopNKlEstimate {
  double kl;          // KL_lb (nats)
  size_t n_returned;  // |R|
  size_t n_missing;   // |M|: stored reference tokens the backend did not return
};
TopNKlEstimate kl_divergence_topn(std::span<const int32_t> ref_topk_ids,
                                  std::span<const float> ref_topk_logits, double ref_lse,
                                  std::span<const float> test_logprobs);

// Exact KL(P||Q) with P = softmax(ref_logits), Q = softmax(test_logits), nats,
// summed index ascending in double, clamped at 0 against rounding.
// Sizes must match and be non-zero (Error). Non-finite ref -> Error;
// non-finite test -> +inf.
double kl_divergence_full(std::span<const float> ref_logits, std::span<const float> test_logits);

// ---------------------------------------------------------------------------
// Summaries.

struct Summary {
  size_t n;
  double mean, median, p90, p95, p99, max, min;
};

// Percentiles by the nearest-rank method on the ascending-sorted values:
//   P_p = sorted[ceil(p * n / 100) - 1]   (1-based rank ceil(p n / 100))
// computed in integer arithmetic, so it is always one of the values (no
// interpolation). median = P_50 (for even n the lower middle value).
// mean = sum / n in double, input order. +Inf values are allowed.
// Throws Error on empty input or any NaN (named by index).
Summary summarize(std::span<const double> values);

// llama-perplexity --kl-divergence style statistics over scored positions.
struct ScoringStats {
  size_t n_positions;
  Summary kld;              // per-position KL estimates (nats)
  double max_p_tail;        // largest reference tail mass (bounds the KL estimate error)
  double max_kl_gap_bound;  // max over positions of kl_upper - kl (nats)
  double top1_agreement;    // fraction of positions where argmax(test) == ref top-1 id
  double rms_delta_p;       // sqrt(mean((q(target) - p(target))^2)), target = next token
  double ppl_ref, ppl_test, ppl_ratio;  // exp(mean NLL of target); ratio = ppl_test / ppl_ref
  size_t n_nonfinite_positions;         // positions whose test row had NaN/Inf
};

// Accumulates positions one at a time so callers never hold all test logits.
// Per position:
//   KL: kl_divergence_topk(); ref top-1 = best stored entry by (logit desc,
//   id asc) (the stored order does not matter);
//   p(target) = exp(ref_target_logit - ref_lse), q(target) = exp(t[target] - lse_test)
//   NLL_ref = ref_lse - ref_target_logit, NLL_test = lse_test - t[target].
// A non-finite test row counts as: KL = +inf, top-1 disagreement, squared
// delta-p = +inf, NLL_test = +inf (so rms_delta_p, ppl_test, ppl_ratio = +inf).
// ppl_ratio = exp(mean NLL_test - mean NLL_ref).
// Errors: as kl_divergence_topk, plus target_id out of range, non-finite
// ref_target_logit, ref_target_logit > ref_lse + 1e-3; finish() with no
// positions.
class ScoringAccumulator {
 public:
  // What add() found at this one position (for per-position series).
  struct Position {
    double kl;        // the KL estimate (+inf for a non-finite test row)
    bool top1_match;  // argmax(test) == ref top-1 id (false for a non-finite row)
  };
  Position add(std::span<const int32_t> ref_topk_ids, std::span<const float> ref_topk_logits,
               double ref_lse, float ref_target_logit, int32_t target_id,
               std::span<const float> test_logits);
  ScoringStats finish() const;

 private:
  std::vector<double> kl_;
  double max_p_tail_ = 0.0;
  double max_gap_ = 0.0;
  size_t top1_agree_ = 0;
  double sum_sq_dp_ = 0.0;
  double sum_nll_ref_ = 0.0;
  double sum_nll_test_ = 0.0;
  size_t nonfinite_ = 0;
};

// ---------------------------------------------------------------------------
// Near-tie rule for greedy comparison at the first divergent position
// (vLLM tests/models/utils.py check_logprobs_close: each side's token must be
// in the other's top-k), plus a margin condition on the reference.

struct NearTieVerdict {
  bool accepted;
  double ref_margin;      // r[top1] - r[top2] over the stored reference top-K
  bool test_in_ref_topk;  // test_token among the first min(k, K) ranked ref entries
  bool ref_in_test_topk;  // ref top-1 among top_k(test_logits, k)
};

// The stored reference top-K is ranked internally by (logit desc, id asc), so
// its stored order does not matter. accepted iff
//   test_token == ref top-1 (no divergence at all), or
//   ref_margin < margin_eps AND test_in_ref_topk AND ref_in_test_topk
// and the test row is finite (a non-finite row is never accepted).
// Errors: K < 2, size mismatch, ids out of range or duplicated, non-finite
// ref logits, test_token out of range, k <= 0, margin_eps NaN or < 0.
NearTieVerdict near_tie(std::span<const int32_t> ref_topk_ids,
                        std::span<const float> ref_topk_logits, int32_t test_token,
                        std::span<const float> test_logits, double margin_eps, int k);

}  // namespace touchstone::metrics
