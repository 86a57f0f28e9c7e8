#include "touchstone/harness/parity.h"
#include "touchstone/harness/recorder.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "touchstone/common/error.h"
#include "touchstone/harness/structured.h"

namespace touchstone {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Test logits gathered at the reference's stored top-K ids.
std::vector<float> gather(std::span<const float> row, std::span<const int32_t> ids) {
  std::vector<float> out;
  out.reserve(ids.size());
  for (int32_t id : ids) out.push_back(row[size_t(id)]);
  return out;
}

const char* const kPointNames[kTapPoints] = {"attention output", "FFN output", "residual"};

// Compares one step's backend taps with the golden's record; notes the first
// point over the tolerance (layers in order, points in order within a layer).
void compare_taps(const GoldenCase& g, size_t t, std::span<const float> test, double tol,
                  CaseResult& r) {
  ++r.tap_steps_compared;
  r.backend_taps.insert(r.backend_taps.end(), test.begin(), test.end());
  if (r.first_layer_divergence) return;
  const size_t D = size_t(g.tap_dim);
  const float* ref = g.taps.data() + t * g.tap_record_size();
  for (int l = 0; l < g.tap_layers; ++l) {
    for (int p = 0; p < kTapPoints; ++p) {
      const size_t off = (size_t(l) * kTapPoints + size_t(p)) * D;
      const double e = metrics::nmse(std::span<const float>(ref + off, D), test.subspan(off, D));
      if (!(e <= tol)) {
        r.first_layer_divergence = LayerDivergence{g.tap_steps[t], l, p, e, tol, {}};
        return;
      }
    }
  }
}

// Records the first logit-criterion violation (step + description) once.
void note_violation(CaseResult& r, int step, const std::string& what) {
  if (r.first_logit_violation_step < 0) {
    r.first_logit_violation_step = step;
    r.first_logit_violation = what;
  }
}

// The named violations behind "logits diverge at step N": the worst NMSE /
// max-abs over the compared steps, and non-finite logits.
void record_logit_violations(CaseResult& r, const Profile& p) {
  if (r.nonfinite > 0) r.violations.push_back({"non_finite", double(r.nonfinite), 0.0});
  if (p.logits_nmse_max && !(r.nmse_max <= *p.logits_nmse_max))
    r.violations.push_back({"logits_nmse", r.nmse_max, *p.logits_nmse_max});
  if (p.logits_max_abs_max && !(r.max_abs <= *p.logits_max_abs_max))
    r.violations.push_back({"logits_max_abs", r.max_abs, *p.logits_max_abs_max});
}

// TS_CAP_DEVICE_GREEDY: the same teacher-forced steps again through
// prefill_greedy; the token the backend returns must be the argmax of the
// logits it returned for that step (lowest id on ties), step for step.
void check_device_greedy(BackendSession& session, const GoldenCase& g,
                         const std::vector<int32_t>& host_argmax, CaseResult& r) {
  try {
    session.rewind(0);
    for (size_t s = 0; s < host_argmax.size(); ++s) {
      const int32_t dev =
          s == 0 ? session.prefill_greedy(g.prompt_ids)
                 : session.prefill_greedy(std::span<const int32_t>(&g.greedy_ids[s - 1], 1));
      ++r.device_greedy_steps;
      if (dev != host_argmax[s]) {
        r.failures.push_back(fmt::format(
            "device greedy at step {}: prefill_greedy returned {}, the argmax of the backend's "
            "own logits is {}",
            s, dev, host_argmax[s]));
        r.violations.push_back({"device_greedy", double(s), 0.0});
        return;
      }
    }
  } catch (const std::exception& e) {
    r.failures.push_back(fmt::format("device greedy: {}", e.what()));
    r.violations.push_back({"device_greedy", 0.0, 0.0});
    if (dynamic_cast<const BackendError*>(&e)) r.backend_error = e.what();
  }
}

// One step's logit agreement.
struct StepMeasure {
  double nmse = NAN, max_abs = NAN, kl = 0.0;
};

// Full rows: NMSE / max-abs on the full row while the golden stores it, on the
// stored top-K ids after; the top-K KL estimate.
StepMeasure measure_full(const GoldenCase& g, int s, std::span<const float> row, const Profile& p,
                         CaseResult& r) {
  const size_t V = size_t(g.n_vocab), K = size_t(g.top_k);
  const std::span<const int32_t> ref_ids(g.topk_ids.data() + size_t(s) * K, K);
  const std::span<const float> ref_vals(g.topk_logits.data() + size_t(s) * K, K);
  const size_t bad = metrics::count_nonfinite(row);
  r.nonfinite += bad;
  if (bad > 0) note_violation(r, s, fmt::format("{} non-finite logits", bad));
  StepMeasure m;
  if (s < g.n_full_steps) {
    const std::span<const float> ref_row(g.full_logits.data() + size_t(s) * V, V);
    m.nmse = metrics::nmse(ref_row, row);
    m.max_abs = metrics::max_abs_diff(ref_row, row);
  } else {
    const std::vector<float> test_vals = gather(row, ref_ids);
    m.nmse = metrics::nmse(ref_vals, test_vals);
    m.max_abs = metrics::max_abs_diff(ref_vals, test_vals);
  }
  r.nmse_max = std::max(r.nmse_max, m.nmse);
  r.max_abs = std::max(r.max_abs, m.max_abs);
  if (p.logits_nmse_max && !(m.nmse <= *p.logits_nmse_max)) {
    note_violation(r, s, fmt::format("logits NMSE {:.3e} > {:.1e}", m.nmse, *p.logits_nmse_max));
  }
  if (p.logits_max_abs_max && !(m.max_abs <= *p.logits_max_abs_max)) {
    note_violation(r, s,
                   fmt::format("logits max-abs {:.3e} > {:.1e}", m.max_abs, *p.logits_max_abs_max));
  }
  m.kl = metrics::kl_divergence_topk(ref_ids, ref_vals, g.lse[size_t(s)], row).kl;
  return m;
}

// Top-N log-probability rows (ABI v5): only the KL lower bound; NaN / +Inf, or
// no returned entry at all, is a violation.
StepMeasure measure_top_n(const GoldenCase& g, int s, std::span<const float> row, CaseResult& r) {
  const size_t K = size_t(g.top_k);
  size_t bad = 0, finite = 0;
  for (float v : row) {
    if (std::isnan(v) || v == INFINITY) ++bad;
    if (std::isfinite(v)) ++finite;
  }
  r.nonfinite += bad;
  if (bad > 0) note_violation(r, s, fmt::format("{} NaN / +Inf log-probabilities", bad));
  if (finite == 0) note_violation(r, s, "no log-probability returned");
  const metrics::TopNKlEstimate e = metrics::kl_divergence_topn(
      std::span<const int32_t>(g.topk_ids.data() + size_t(s) * K, K),
      std::span<const float>(g.topk_logits.data() + size_t(s) * K, K), g.lse[size_t(s)], row);
  r.topn_missing_max = std::max(r.topn_missing_max, int(e.n_missing));
  StepMeasure m;
  m.kl = e.kl;
  return m;
}

void mark_top_n(CaseResult& r, int top_n) {
  r.logprobs_top_n = top_n;
  r.nmse_max = r.max_abs = NAN;
  r.not_supported = {"logits_nmse", "logits_max_abs", "device_greedy", "layer_taps"};
}

// A top-N row, or a row masked by a grammar, for the near-tie rule (which
// refuses non-finite rows): the tokens not returned (not allowed) become the
// lowest float, below every other one.
std::vector<float> finite_floor(std::span<const float> row) {
  std::vector<float> out(row.begin(), row.end());
  for (float& v : out)
    if (v == -INFINITY) v = std::numeric_limits<float>::lowest();
  return out;
}

// Where a case or passage is: the call in flight and its step/position, so a
// failing call (error status, crash, time-out) is reported with both.
struct Progress {
  const char* call = "open";
  int step = -1;
};

std::string where(const Progress& at, const char* unit) {
  return at.step < 0 ? fmt::format("{}", at.call)
                     : fmt::format("{} {} ({})", unit, at.step, at.call);
}

// The teacher-forced steps of one case; a failing backend call throws, with
// `at` saying where.
// The golden's record of one step: its top-K ids and logits, its greedy token.
struct GoldenStep {
  std::span<const int32_t> ids;
  std::span<const float> vals;
  int32_t token = 0;
};

// A greedy flip at step s (test_tok != the golden's): a near tie (accepted, kept in
// r.near_ties) or a divergence (r.first_divergence). Returns true when it fails a
// profile that requires identical greedy tokens: the sequences differ from here.
bool judge_flip(const Tokenizer& tok, const Profile& p, int s, const GoldenStep& ref,
                int32_t test_tok, std::span<const float> row, CaseResult& r) {
  const metrics::NearTieVerdict v =
      metrics::near_tie(ref.ids, ref.vals, test_tok, row, p.near_tie_margin, p.near_tie_top_k);
  GreedyDivergence d{s,
                     ref.token,
                     test_tok,
                     tok.token_bytes(ref.token),
                     tok.token_bytes(test_tok),
                     v.ref_margin,
                     v.accepted,
                     v.test_in_ref_topk,
                     v.ref_in_test_topk};
  if (!r.first_divergence) r.first_divergence = d;
  if (!v.accepted && r.first_unaccepted_flip_step < 0) r.first_unaccepted_flip_step = s;
  if (v.accepted) {
    r.near_ties.push_back(d);
    return false;
  }
  if (!p.greedy_identical()) return false;
  r.failures.push_back(fmt::format(
      "greedy diverges at step {}: reference {} {:?} vs backend {} {:?} (reference top-2 margin "
      "{:.4f} nats; near-tie needs < {} and both in each other's top-{}: {}/{})",
      s, ref.token, d.ref_text, test_tok, d.test_text, v.ref_margin, p.near_tie_margin,
      p.near_tie_top_k, v.test_in_ref_topk ? "yes" : "no", v.ref_in_test_topk ? "yes" : "no"));
  r.violations.push_back({"greedy", double(s), 0.0});
  return true;
}

// The golden's allowed set at step s of grammar case g.
std::span<const uint32_t> golden_mask(const GoldenCase& g, int s) {
  return {g.allowed_masks.data() + size_t(s) * g.mask_words(), g.mask_words()};
}

// structured.mask_parity: `mask` (the allowed set of `whose`: the oracle when
// the harness applies the grammar, the backend when it enforces it) against the
// golden's at step s; a difference names the step and the first tokens allowed
// by one side only, with their bytes. Then the row with every token outside the
// set at -inf, of which the greedy token is the argmax (structured.constrained_greedy).
std::vector<float> masked_row(std::span<const uint32_t> mask, const char* whose,
                              const Tokenizer& tok, const GoldenCase& g, int s,
                              std::span<const float> row, CaseResult& r) {
  const std::span<const uint32_t> want = golden_mask(g, s);
  if (!std::equal(mask.begin(), mask.end(), want.begin(), want.end())) {
    std::string diff;
    int shown = 0;
    for (int32_t t = 0; t < g.n_vocab && shown < 4; ++t) {
      const bool a = grammar::mask_allows(mask, t), b = grammar::mask_allows(want, t);
      if (a == b) continue;
      diff += fmt::format("{}token {} {:?} allowed by {} only", shown++ ? "; " : "", t,
                          tok.token_bytes(t), a ? whose : "the golden");
    }
    r.failures.push_back(
        fmt::format("structured.mask_parity: step {}: {} allows {} tokens, the golden {}: {}", s,
                    whose, grammar::mask_count(mask), grammar::mask_count(want), diff));
    size_t differing = 0;  // tokens allowed by one side only
    for (size_t w = 0; w < mask.size(); ++w)
      differing += size_t(__builtin_popcount(mask[w] ^ want[w]));
    r.violations.push_back({"mask_difference", double(differing), 0.0});
    if (r.first_mask_difference_step < 0) r.first_mask_difference_step = s;
  }
  std::vector<float> masked(row.begin(), row.end());
  grammar::apply_mask(mask, masked);
  return masked;
}

// The greedy token of step s under a grammar: the backend's own pick when it
// enforces the grammar (its mask judged), else the argmax over the oracle's set.
struct ConstrainedStep {
  std::vector<float> masked;
  int32_t token = -1;
};
ConstrainedStep constrained_step(BackendSession& session, const grammar::GrammarOracle& o,
                                 const Tokenizer& tok, const GoldenCase& g, int s,
                                 std::span<const float> row, CaseResult& r) {
  ConstrainedStep c;
  if (!session.grammar_set()) {
    c.masked = masked_row(o.allowed_mask(), "the oracle", tok, g, s, row, r);
    c.token = metrics::argmax(c.masked);
    return c;
  }
  if (const std::optional<std::vector<uint32_t>> m = session.exposed_grammar_mask()) {
    c.masked = masked_row(*m, "the backend", tok, g, s, row, r);
  } else {  // a backend that does not expose its sets: its pick judged over the golden's
    c.masked = masked_row(golden_mask(g, s), "the golden", tok, g, s, row, r);
    if (r.not_supported.empty() || r.not_supported.back() != kMaskParityNotExposed)
      r.not_supported.push_back(kMaskParityNotExposed);
  }
  c.token = session.grammar_greedy(1)[0];
  return c;
}

// Teacher forcing under a grammar: the golden token advances the oracle (a
// stop token ends the case; the grammar refusing a golden token is a failure).
void advance_oracle(grammar::GrammarOracle& o, int32_t token, int s, CaseResult& r) {
  if (o.vocab().is_stop(token)) return;
  if (!o.accept(token)) {
    r.failures.push_back(
        fmt::format("structured: step {}: the grammar refuses the golden token {}", s, token));
    r.violations.push_back({"structured", double(s), 0.0});
  }
}

void run_case_steps(BackendSession& session, const Tokenizer& tok, const GoldenCase& g,
                    const Profile& p, CaseResult& r, std::vector<double>& kls,
                    std::vector<int32_t>& host_argmax, Progress& at, const ProgressFn& progress) {
  const size_t K = size_t(g.top_k);
  if (session.n_vocab() != g.n_vocab) {
    throw Error("backend n_vocab {} != golden n_vocab {}", session.n_vocab(), g.n_vocab);
  }
  at = {"capabilities", -1};
  const int top_n = session.top_n_logprobs();
  if (top_n > 0) mark_top_n(r, top_n);
  // Layer taps: when both sides have them and the profile gives a tolerance.
  const std::optional<double> tol = p.layer_tolerance();
  const bool taps = !g.tap_steps.empty() && session.has_taps() && tol.has_value();
  at = {"set_taps", -1};
  if (taps) session.set_taps(true);
  at = {"rewind", -1};
  session.rewind(0);
  std::optional<grammar::GrammarOracle> oracle = golden_case_oracle(tok, g);
  at = {"prefill", 0};
  std::vector<float> logits = prefill_case_prompt(session, g);  // an image: its embeddings too
  if (oracle) {
    r.grammar_enforcement = enforce_grammar(session, g);
    at = {"set_grammar", 0};
  }
  r.full_row_steps = std::min(g.n_full_steps, r.n_total);
  bool stop = false;
  size_t next_tap = 0;
  for (int s = 0; s < r.n_total && !stop; ++s) {
    if (taps && next_tap < g.tap_steps.size() && g.tap_steps[next_tap] == s) {
      at = {"read_taps", s};
      compare_taps(g, next_tap, session.read_taps(g.tap_record_size()), *tol, r);
      ++next_tap;
    }
    const std::span<const float> row(logits);
    const std::span<const int32_t> ref_ids(g.topk_ids.data() + size_t(s) * K, K);
    const std::span<const float> ref_vals(g.topk_logits.data() + size_t(s) * K, K);
    r.n_steps = s + 1;
    const StepMeasure m = top_n > 0 ? measure_top_n(g, s, row, r) : measure_full(g, s, row, p, r);
    kls.push_back(m.kl);

    // Greedy agreement (under a grammar: over the allowed set).
    const int32_t ref_tok = g.greedy_ids[size_t(s)];
    at = {"grammar_greedy", s};
    ConstrainedStep c;
    try {
      if (oracle) c = constrained_step(session, *oracle, tok, g, s, row, r);
    } catch (const BackendError& e) {
      // A server's pick after a token it did not generate (teacher forcing past
      // an accepted near tie) is not available: the sequences parted there.
      if (e.status() != TS_ERR_UNSUPPORTED || !r.first_divergence) throw;
      // The comparison ends where they parted; an accepted near tie there is
      // no disagreement (top-1 agreement counts the steps before it).
      if (r.first_divergence->accepted && r.first_divergence->step == s - 1) r.n_steps = s - 1;
      break;
    }
    if (oracle && c.token >= 0 && !grammar::mask_allows(golden_mask(g, s), c.token)) {
      // Never a near tie: a pick outside the grammar's set fails on every profile.
      r.failures.push_back(fmt::format(
          "structured.constrained_greedy: step {}: the backend picked {} {:?}, which the grammar "
          "refuses (the golden allows {} tokens here)",
          s, c.token, tok.token_bytes(c.token), grammar::mask_count(golden_mask(g, s))));
      r.violations.push_back({"greedy", double(s), 0.0});
      if (r.first_unaccepted_flip_step < 0) r.first_unaccepted_flip_step = s;
      break;
    }
    const std::span<const float> judged = oracle ? std::span<const float>(c.masked) : row;
    const int32_t test_tok = oracle ? c.token : metrics::argmax(judged);
    r.series.push_back({test_tok == ref_tok, K >= 2 ? metrics::top2_margin(ref_vals) : NAN, m.kl,
                        m.nmse, m.max_abs});
    if (progress) progress(s + 1, r.n_total);
    if (test_tok < 0) {  // every logit NaN, or nothing allowed: there is no greedy token
      const std::string why =
          oracle ? "no token is allowed (or every allowed logit is NaN)" : "every logit is NaN";
      r.failures.push_back(fmt::format("step {}: {}, no greedy token", s, why));
      note_violation(r, s, why);
      break;
    }
    host_argmax.push_back(test_tok);
    if (test_tok == ref_tok) {
      ++r.n_matched;
    } else if (judge_flip(
                   tok, p, s, {ref_ids, ref_vals, ref_tok}, test_tok,
                   top_n > 0 || oracle ? std::span<const float>(finite_floor(judged)) : judged,
                   r)) {
      stop = true;  // sequences have diverged: later steps are not comparable
      continue;
    }
    if (oracle) advance_oracle(*oracle, ref_tok, s, r);
    if (s + 1 < r.n_total) {
      at = {"decode", s + 1};
      session.decode(ref_tok, logits);  // teacher-forced
    }
  }
  at = {"set_taps", -1};
  if (taps) session.set_taps(false);
}

}  // namespace

std::string LayerDivergence::point_name() const {
  return point >= 0 && point < kTapPoints ? kPointNames[point] : "?";
}

std::string LayerDivergence::describe() const {
  return fmt::format("layer {}, {}: NMSE {:.3e} > {:.1e} (step {})", layer, point_name(), nmse,
                     tolerance, step);
}

CaseResult check_case(BackendSession& session, const Tokenizer& tok, const GoldenCase& g,
                      const Profile& p, int max_steps, const ProgressFn& progress) {
  const auto t0 = Clock::now();
  CaseResult r;
  r.name = g.name;
  r.n_total = int(g.greedy_ids.size());
  if (max_steps > 0) r.n_total = std::min(r.n_total, max_steps);
  std::vector<double> kls;
  std::vector<int32_t> host_argmax;  // argmax of the backend's own logits per step
  Progress at;
  try {
    run_case_steps(session, tok, g, p, r, kls, host_argmax, at, progress);
  } catch (const std::exception& e) {
    r.backend_error = fmt::format("{}: {}", where(at, "step"), e.what());
    r.failures.push_back(r.backend_error);
    r.violations.push_back({"backend_error", 0.0, 0.0});
  }
  // Device greedy is unconstrained: not comparable with a grammar case's tokens; it
  // takes tokens only: not an image case's prompt.
  if (r.backend_error.empty() && session.has_device_greedy() && !g.has_grammar() &&
      !g.has_image()) {
    check_device_greedy(session, g, host_argmax, r);
  }
  if (!kls.empty()) {
    const metrics::Summary ks = metrics::summarize(kls);
    r.kld_mean = ks.mean;
    r.kld_max = ks.max;
    r.kld_p99 = ks.p99;
    if (p.kld_mean_max && !(ks.mean <= *p.kld_mean_max)) {
      r.failures.push_back(
          fmt::format("mean KLD over steps {:.3e} > {:.1e}", ks.mean, *p.kld_mean_max));
      r.violations.push_back({"kld_mean", ks.mean, *p.kld_mean_max});
    }
    if (p.kld_p99_max && !(ks.p99 <= *p.kld_p99_max)) {
      r.failures.push_back(
          fmt::format("p99 KLD over steps {:.3e} > {:.1e}", ks.p99, *p.kld_p99_max));
      r.violations.push_back({"kld_p99", ks.p99, *p.kld_p99_max});
    }
  }
  if (!p.greedy_identical() && p.top1_agreement_min) {
    const double agree = r.n_steps ? double(r.n_matched) / r.n_steps : 0.0;
    if (!(agree >= *p.top1_agreement_min)) {
      r.failures.push_back(
          fmt::format("top-1 agreement {:.4f} < {}", agree, *p.top1_agreement_min));
      r.violations.push_back({"top1_agreement", agree, *p.top1_agreement_min});
    }
  }
  if (r.first_logit_violation_step >= 0) {
    r.failures.push_back(fmt::format("logits diverge at step {}: {}", r.first_logit_violation_step,
                                     r.first_logit_violation));
    record_logit_violations(r, p);
  }
  if (!r.failures.empty() && r.first_layer_divergence) {
    r.failures.push_back("first divergent layer: " + r.first_layer_divergence->describe());
  } else if (!r.failures.empty() && r.first_logit_violation_step >= 0) {
    // Every tap matched; when the logits broke at a step whose taps were
    // compared, the fault is past the last layer.
    const auto compared = std::span<const int32_t>(g.tap_steps)
                              .first(std::min(g.tap_steps.size(), size_t(r.tap_steps_compared)));
    if (std::find(compared.begin(), compared.end(), r.first_logit_violation_step) !=
        compared.end()) {
      r.failures.push_back(fmt::format(
          "every layer tap matches the reference at step {}: the divergence is after the last "
          "layer (output norm, LM head, logit softcap)",
          r.first_logit_violation_step));
    }
  }
  r.passed = r.failures.empty();
  r.seconds = seconds_since(t0);
  return r;
}

// The first scored position out of the profile (per-position top-K NMSE or
// max |diff|, non-finite logits, or a top-1 flip that is not a near-tie), so a
// failing passage names where it breaks.
void note_first_failing(ScoringResult& r, const Profile& p, int pos, std::span<const int32_t> ids,
                        std::span<const float> vals, std::span<const float> row, double e2,
                        double r2, double pos_max) {
  const double nmse = r2 > 0 ? e2 / r2 : 0.0;
  std::string why;
  if (!std::isfinite(e2) || !metrics::all_finite(row)) {
    why = "non-finite logits";
  } else if (p.logits_nmse_max && nmse > *p.logits_nmse_max) {
    why = fmt::format("top-K NMSE {:.3e} > {:.1e}", nmse, *p.logits_nmse_max);
  } else if (p.logits_max_abs_max && pos_max > *p.logits_max_abs_max) {
    why = fmt::format("top-K max-abs {:.3e} > {:.1e}", pos_max, *p.logits_max_abs_max);
  } else if (!ids.empty() && metrics::argmax(row) != ids[0] &&
             (vals.size() < 2 || double(vals[0]) - double(vals[1]) >= p.near_tie_margin)) {
    why = fmt::format("top-1 {} instead of {}", metrics::argmax(row), ids[0]);
  } else {
    return;
  }
  r.first_failing_position = pos;
  r.first_failing = why;
}

// The passage's verdict: one failure line and one named violation per
// criterion of the profile it breaks.
static void judge_scoring(ScoringResult& r, const Profile& p) {
  auto fail = [&](const std::string& s) { r.failures.push_back(s); };
  const metrics::ScoringStats& st = r.stats;
  auto violate = [&](const char* check, double value, double limit, const std::string& text) {
    fail(text);
    r.violations.push_back({check, value, limit});
  };
  if (st.n_nonfinite_positions)
    violate("non_finite", double(st.n_nonfinite_positions), 0.0,
            fmt::format("{} positions with non-finite logits", st.n_nonfinite_positions));
  if (p.kld_mean_max && !(st.kld.mean <= *p.kld_mean_max)) {
    violate("kld_mean", st.kld.mean, *p.kld_mean_max,
            fmt::format("mean KLD {:.3e} > {:.1e}", st.kld.mean, *p.kld_mean_max));
  }
  if (p.kld_p99_max && !(st.kld.p99 <= *p.kld_p99_max)) {
    violate("kld_p99", st.kld.p99, *p.kld_p99_max,
            fmt::format("p99 KLD {:.3e} > {:.1e}", st.kld.p99, *p.kld_p99_max));
  }
  if (p.top1_agreement_min && !(st.top1_agreement >= *p.top1_agreement_min)) {
    violate("top1_agreement", st.top1_agreement, *p.top1_agreement_min,
            fmt::format("top-1 agreement {:.4f} < {}", st.top1_agreement, *p.top1_agreement_min));
  }
  if (p.ppl_ratio_max &&
      !(st.ppl_ratio <= *p.ppl_ratio_max && 1.0 / st.ppl_ratio <= *p.ppl_ratio_max)) {
    violate("ppl_ratio", std::max(st.ppl_ratio, 1.0 / st.ppl_ratio), *p.ppl_ratio_max,
            fmt::format("PPL ratio {:.5f} outside [1/{}, {}]", st.ppl_ratio, *p.ppl_ratio_max,
                        *p.ppl_ratio_max));
  }
  if (p.logits_nmse_max && !(r.topk_nmse <= *p.logits_nmse_max)) {
    violate("logits_nmse", r.topk_nmse, *p.logits_nmse_max,
            fmt::format("top-K logits NMSE {:.3e} > {:.1e}", r.topk_nmse, *p.logits_nmse_max));
  }
  if (p.logits_max_abs_max && !(r.topk_max_abs <= *p.logits_max_abs_max)) {
    violate(
        "logits_max_abs", r.topk_max_abs, *p.logits_max_abs_max,
        fmt::format("top-K logits max-abs {:.3e} > {:.1e}", r.topk_max_abs, *p.logits_max_abs_max));
  }
  if (!r.failures.empty() && r.first_failing_position >= 0) {
    fail(fmt::format("first position out of tolerance: {} ({})", r.first_failing_position,
                     r.first_failing));
  }
}

ScoringResult check_scoring(BackendSession& session, const GoldenScoring& g, const Profile& p,
                            bool all_position_logits, int max_positions,
                            const ProgressFn& progress) {
  const auto t0 = Clock::now();
  ScoringResult r;
  r.name = g.name;
  const size_t V = size_t(g.n_vocab), K = size_t(g.top_k);
  size_t N = g.token_ids.size();
  if (max_positions > 0) N = std::min(N, size_t(max_positions) + 1);
  const std::span<const int32_t> tokens(g.token_ids.data(), N);
  metrics::ScoringAccumulator acc;
  double err2 = 0.0, ref2 = 0.0;
  Progress at;
  auto fail = [&](const std::string& s) { r.failures.push_back(s); };
  try {
    if (session.n_vocab() != g.n_vocab) {
      throw Error("backend n_vocab {} != golden n_vocab {}", session.n_vocab(), g.n_vocab);
    }
    at = {"rewind", -1};
    session.rewind(0);
    auto score = [&](size_t i, std::span<const float> row) {
      if (i + 1 >= N) return;  // the last position predicts nothing
      const std::span<const int32_t> ids(g.topk_ids.data() + i * K, K);
      const std::span<const float> vals(g.topk_logits.data() + i * K, K);
      const metrics::ScoringAccumulator::Position pos =
          acc.add(ids, vals, g.lse[i], g.target_logits[i], g.token_ids[i + 1], row);
      double e2 = 0.0, r2 = 0.0, pos_max = 0.0;
      for (size_t j = 0; j < K; ++j) {
        const double d = double(row[size_t(ids[j])]) - double(vals[j]);
        e2 += d * d;
        r2 += double(vals[j]) * double(vals[j]);
        pos_max = std::max(pos_max, std::isfinite(d) ? std::abs(d) : INFINITY);
      }
      err2 += e2;
      ref2 += r2;
      r.series.push_back({pos.top1_match, pos.kl, r2 > 0 ? e2 / r2 : 0.0, pos_max});
      if (progress) progress(int(i) + 1, int(N) - 1);
      r.topk_max_abs = std::max(r.topk_max_abs, pos_max);
      if (r.first_failing_position < 0)
        note_first_failing(r, p, int(i), ids, vals, row, e2, r2, pos_max);
    };
    if (all_position_logits) {
      // Chunks of at most session.max_rows() positions (memory stays bounded
      // on a 4,096-token passage with a 262,144-entry vocabulary).
      at = {"prefill(all positions)", 0};
      session.prefill_all_rows(tokens, score);
    } else {
      std::vector<float> row_buf(V);
      for (size_t i = 0; i + 1 < N; ++i) {
        if (i == 0) {
          at = {"prefill", 0};
          row_buf = session.prefill(std::span<const int32_t>(g.token_ids.data(), 1));
        } else {
          at = {"decode", int(i)};
          session.decode(g.token_ids[i], row_buf);
        }
        score(i, row_buf);
      }
    }
  } catch (const std::exception& e) {
    r.backend_error = fmt::format("{}: {}", where(at, "position"), e.what());
    fail(r.backend_error);
    r.violations.push_back({"backend_error", 0.0, 0.0});
    r.passed = false;
    r.seconds = seconds_since(t0);
    return r;
  }
  r.topk_nmse = ref2 > 0 ? err2 / ref2 : 0.0;
  if (!std::isfinite(r.topk_nmse)) r.topk_nmse = INFINITY;
  r.stats = acc.finish();
  judge_scoring(r, p);
  r.passed = r.failures.empty();
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace touchstone
