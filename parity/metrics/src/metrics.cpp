// Parity metrics. Formulas and conventions: touchstone/metrics/metrics.h, docs/metrics.md.
#include "touchstone/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "touchstone/common/error.h"

namespace touchstone::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Allowed excess of the stored reference mass over 1 (float-rounded logits
// against a double lse give ~1e-6 at most; more means lse and logits disagree).
constexpr double kMassTolerance = 1e-3;

// Total ranking order: larger value first, NaN after every number, ties (and
// NaN vs NaN) by ascending id. Strict weak ordering, so safe for std::sort.
bool ranks_before(float va, size_t a, float vb, size_t b) {
  const bool na = std::isnan(va);
  const bool nb = std::isnan(vb);
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return a < b;
}

void require_nonempty(size_t n, const char* fn, const char* arg) {
  if (n == 0) throw Error("metrics::{}: {} is empty", fn, arg);
}

void require_vocab_fits(size_t n, const char* fn, const char* arg) {
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("metrics::{}: {} has {} entries, more than int32 ids can address", fn, arg, n);
  }
}

void require_same_size(size_t a, size_t b, const char* fn, const char* an, const char* bn) {
  if (a != b)
    throw Error("metrics::{}: size mismatch: {} has {} entries, {} has {}", fn, an, a, bn, b);
}

// Validates a stored reference top-K against a vocabulary of size `vocab`:
// matching non-zero sizes, ids in range and distinct, finite logits.
void validate_ref_topk(std::span<const int32_t> ids, std::span<const float> logits, size_t vocab,
                       const char* fn) {
  require_nonempty(ids.size(), fn, "ref_topk_ids");
  require_same_size(ids.size(), logits.size(), fn, "ref_topk_ids", "ref_topk_logits");
  if (ids.size() > vocab) {
    throw Error("metrics::{}: ref_topk_ids has {} entries but test_logits (vocab) has only {}", fn,
                ids.size(), vocab);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= vocab) {
      throw Error("metrics::{}: ref_topk_ids[{}] = {} out of range [0, {}) (test_logits size)", fn,
                  i, ids[i], vocab);
    }
    if (!std::isfinite(logits[i])) {
      throw Error("metrics::{}: ref_topk_logits[{}] = {} is not finite (corrupt golden?)", fn, i,
                  logits[i]);
    }
  }
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    throw Error("metrics::{}: ref_topk_ids contains id {} more than once ({} entries)", fn, *dup,
                ids.size());
  }
}

// Positions into the stored top-K, ranked by (logit desc, id asc).
std::vector<size_t> rank_stored(std::span<const int32_t> ids, std::span<const float> logits) {
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ranks_before(logits[a], static_cast<size_t>(ids[a]), logits[b],
                        static_cast<size_t>(ids[b]));
  });
  return order;
}

// Stored entry with the best rank (the reference greedy token).
size_t best_stored(std::span<const int32_t> ids, std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ranks_before(logits[i], static_cast<size_t>(ids[i]), logits[best],
                     static_cast<size_t>(ids[best]))) {
      best = i;
    }
  }
  return best;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  require_nonempty(logits.size(), "argmax", "logits");
  require_vocab_fits(logits.size(), "argmax", "logits");
  size_t best = logits.size();  // none yet
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best == logits.size() || logits[i] > logits[best]) best = i;  // strict: ties keep lowest id
  }
  return best == logits.size() ? kNoToken : static_cast<int32_t>(best);
}

TopK top_k(std::span<const float> logits, int k) {
  require_nonempty(logits.size(), "top_k", "logits");
  require_vocab_fits(logits.size(), "top_k", "logits");
  if (k <= 0)
    throw Error("metrics::top_k: k = {} must be > 0 (logits has {} entries)", k, logits.size());
  const size_t kk = std::min(static_cast<size_t>(k), logits.size());
  std::vector<size_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(kk), idx.end(),
                    [&](size_t a, size_t b) { return ranks_before(logits[a], a, logits[b], b); });
  TopK out;
  out.ids.reserve(kk);
  out.values.reserve(kk);
  for (size_t i = 0; i < kk; ++i) {
    out.ids.push_back(static_cast<int32_t>(idx[i]));
    out.values.push_back(logits[idx[i]]);
  }
  return out;
}

double log_sum_exp(std::span<const float> logits) {
  require_nonempty(logits.size(), "log_sum_exp", "logits");
  double m = -kInf;
  for (const float x : logits) {
    if (std::isnan(x)) return kNaN;
    m = std::max(m, static_cast<double>(x));
  }
  if (std::isinf(m)) return m;  // +Inf present, or every entry is -Inf
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - m);
  return m + std::log(sum);  // sum >= 1 (the max contributes exp(0))
}

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); });
}

size_t count_nonfinite(std::span<const float> values) {
  return static_cast<size_t>(
      std::count_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); }));
}

double nmse(std::span<const float> ref, std::span<const float> test) {
  require_nonempty(ref.size(), "nmse", "ref");
  require_same_size(ref.size(), test.size(), "nmse", "ref", "test");
  double num = 0.0;
  double den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(test[i])) return kInf;
    const double r = ref[i];
    const double d = r - static_cast<double>(test[i]);
    num += d * d;
    den += r * r;
  }
  if (num == 0.0) return 0.0;
  if (den == 0.0) return kInf;
  return num / den;
}

double max_abs_diff(std::span<const float> ref, std::span<const float> test) {
  require_nonempty(ref.size(), "max_abs_diff", "ref");
  require_same_size(ref.size(), test.size(), "max_abs_diff", "ref", "test");
  double m = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(test[i])) return kInf;
    m = std::max(m, std::fabs(static_cast<double>(ref[i]) - static_cast<double>(test[i])));
  }
  return m;
}

double top2_margin(std::span<const float> logits) {
  if (logits.size() < 2) {
    throw Error("metrics::top2_margin: logits has {} entries, need at least 2", logits.size());
  }
  const TopK t = top_k(logits, 2);
  // NaN - x = NaN; +Inf - +Inf = NaN: both documented.
  return static_cast<double>(t.values[0]) - static_cast<double>(t.values[1]);
}

namespace {

// The test logits outside the reference's top-K ids: their largest and
// smallest value, and log Q_tail = log-sum-exp over them (index ascending)
// minus lse_test; -inf when there are none (K == V: Q_tail = 0).
struct TestTail {
  double max = -kInf, min = kInf, log_q = -kInf;
};

TestTail test_tail(std::span<const int32_t> ref_topk_ids, std::span<const float> test_logits,
                   double lse_test) {
  const size_t K = ref_topk_ids.size(), V = test_logits.size();
  std::vector<int32_t> sorted_ids(ref_topk_ids.begin(), ref_topk_ids.end());
  std::sort(sorted_ids.begin(), sorted_ids.end());
  // Calls fn(logit) for every id not stored, index ascending.
  auto for_tail = [&](auto&& fn) {
    size_t s = 0;
    for (size_t j = 0; j < V; ++j) {
      if (s < K && static_cast<size_t>(sorted_ids[s]) == j) {
        ++s;
        continue;
      }
      fn(static_cast<double>(test_logits[j]));
    }
  };
  TestTail t;
  for_tail([&](double x) {
    t.max = std::max(t.max, x);
    t.min = std::min(t.min, x);
  });
  if (K < V) {
    double sum = 0.0;
    for_tail([&](double x) { sum += std::exp(x - t.max); });
    t.log_q = t.max + std::log(sum) - lse_test;
  }
  return t;
}

}  // namespace

KlEstimate kl_divergence_topk(std::span<const int32_t> ref_topk_ids,
                              std::span<const float> ref_topk_logits, double ref_lse,
                              std::span<const float> test_logits) {
  constexpr const char* fn = "kl_divergence_topk";
  require_nonempty(test_logits.size(), fn, "test_logits");
  require_vocab_fits(test_logits.size(), fn, "test_logits");
  validate_ref_topk(ref_topk_ids, ref_topk_logits, test_logits.size(), fn);
  if (!std::isfinite(ref_lse))
    throw Error("metrics::{}: ref_lse = {} is not finite (corrupt golden?)", fn, ref_lse);

  const size_t K = ref_topk_ids.size();
  const size_t V = test_logits.size();

  // Reference top-K mass, index order of the stored entries.
  double p_sum = 0.0;
  double r_min = kInf;
  for (size_t i = 0; i < K; ++i) {
    p_sum += std::exp(static_cast<double>(ref_topk_logits[i]) - ref_lse);
    r_min = std::min(r_min, static_cast<double>(ref_topk_logits[i]));
  }
  if (p_sum > 1.0 + kMassTolerance) {
    throw Error(
        "metrics::{}: reference top-K mass {} exceeds 1 (ref_lse = {} inconsistent with {} "
        "ref_topk_logits)",
        fn, p_sum, ref_lse, K);
  }

  const double p_tail = K == V ? 0.0 : std::max(0.0, 1.0 - p_sum);  // K == V: empty tail
  if (!all_finite(test_logits)) return KlEstimate{kInf, p_tail, kNaN, kInf};
  const double lse_test = log_sum_exp(test_logits);

  // Top-K terms. d = log p_i - log q_i, evaluated as (r - t) - (lse_r - lse_t).
  const double dlse = ref_lse - lse_test;
  double kl = 0.0;
  bool identical = ref_lse == lse_test;
  for (size_t i = 0; i < K; ++i) {
    const float r = ref_topk_logits[i];
    const float t = test_logits[static_cast<size_t>(ref_topk_ids[i])];
    identical = identical && r == t;
    const double p = std::exp(static_cast<double>(r) - ref_lse);
    const double d = (static_cast<double>(r) - static_cast<double>(t)) - dlse;
    kl += p * d;
  }

  const TestTail tail = test_tail(ref_topk_ids, test_logits, lse_test);
  const double log_q_tail = tail.log_q, t_tailmin = tail.min;
  const double q_tail = std::exp(log_q_tail);

  double gap_bound = 0.0;
  if (p_tail > 0.0) {
    const double log_ratio_tail = std::log(p_tail) - log_q_tail;
    // If every stored p_i equals q_i bit for bit, the coarse-grained distributions are
    // equal and KL_est = 0 exactly (the tail term is 0 in exact arithmetic).
    if (!identical) kl += p_tail * log_ratio_tail;
    // max_{j in tail} log(p_j/q_j) <= (r_min - lse_ref) - (t_tailmin - lse_test)
    const double max_log_ratio = (r_min - ref_lse) - (t_tailmin - lse_test);
    gap_bound = p_tail * std::max(0.0, max_log_ratio - log_ratio_tail);
  }
  kl = identical ? 0.0 : std::max(0.0, kl);  // kl is finite here; clamp rounding below 0
  return KlEstimate{kl, p_tail, q_tail, kl + gap_bound};
}

double kl_divergence_full(std::span<const float> ref_logits, std::span<const float> test_logits) {
  constexpr const char* fn = "kl_divergence_full";
  require_nonempty(ref_logits.size(), fn, "ref_logits");
  require_same_size(ref_logits.size(), test_logits.size(), fn, "ref_logits", "test_logits");
  for (size_t i = 0; i < ref_logits.size(); ++i) {
    if (!std::isfinite(ref_logits[i])) {
      throw Error("metrics::{}: ref_logits[{}] = {} is not finite ({} entries)", fn, i,
                  ref_logits[i], ref_logits.size());
    }
  }
  if (!all_finite(test_logits)) return kInf;
  const double lse_r = log_sum_exp(ref_logits);
  const double dlse = lse_r - log_sum_exp(test_logits);
  double kl = 0.0;
  for (size_t i = 0; i < ref_logits.size(); ++i) {
    const double r = ref_logits[i];
    const double p = std::exp(r - lse_r);
    kl += p * ((r - static_cast<double>(test_logits[i])) - dlse);
  }
  return std::max(0.0, kl);
}

Summary summarize(std::span<const double> values) {
  require_nonempty(values.size(), "summarize", "values");
  double sum = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      throw Error("metrics::summarize: values[{}] is NaN ({} values)", i, values.size());
    }
    sum += values[i];
  }
  std::vector<double> s(values.begin(), values.end());
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  // nearest rank: 1-based rank ceil(p*n/100), exact in integers
  auto pct = [&](size_t p) { return s[std::max<size_t>(1, (p * n + 99) / 100) - 1]; };
  Summary out{};
  out.n = n;
  out.mean = sum / static_cast<double>(n);
  out.median = pct(50);
  out.p90 = pct(90);
  out.p95 = pct(95);
  out.p99 = pct(99);
  out.max = s.back();
  out.min = s.front();
  return out;
}

ScoringAccumulator::Position ScoringAccumulator::add(std::span<const int32_t> ref_topk_ids,
                                                     std::span<const float> ref_topk_logits,
                                                     double ref_lse, float ref_target_logit,
                                                     int32_t target_id,
                                                     std::span<const float> test_logits) {
  constexpr const char* fn = "ScoringAccumulator::add";
  if (target_id < 0 || static_cast<size_t>(target_id) >= test_logits.size()) {
    throw Error("metrics::{}: target_id = {} out of range [0, {}) (test_logits size)", fn,
                target_id, test_logits.size());
  }
  if (!std::isfinite(ref_target_logit)) {
    throw Error("metrics::{}: ref_target_logit = {} is not finite (corrupt golden?)", fn,
                ref_target_logit);
  }
  if (static_cast<double>(ref_target_logit) > ref_lse + kMassTolerance) {
    throw Error("metrics::{}: ref_target_logit = {} exceeds ref_lse = {}", fn, ref_target_logit,
                ref_lse);
  }
  const KlEstimate e = kl_divergence_topk(ref_topk_ids, ref_topk_logits, ref_lse, test_logits);
  const double nll_ref = ref_lse - static_cast<double>(ref_target_logit);
  const double p_target = std::exp(-nll_ref);
  kl_.push_back(e.kl);
  sum_nll_ref_ += nll_ref;
  max_p_tail_ = std::max(max_p_tail_, e.p_tail);  // depends on the reference only

  if (!all_finite(test_logits)) {
    ++nonfinite_;
    sum_sq_dp_ = kInf;
    sum_nll_test_ = kInf;
    max_gap_ = kInf;
    return {e.kl, false};
  }
  max_gap_ = std::max(max_gap_, e.kl_upper - e.kl);
  const size_t best = best_stored(ref_topk_ids, ref_topk_logits);
  const bool top1 = argmax(test_logits) == ref_topk_ids[best];
  if (top1) ++top1_agree_;
  const double lse_test = log_sum_exp(test_logits);
  const double nll_test =
      lse_test - static_cast<double>(test_logits[static_cast<size_t>(target_id)]);
  const double dp = std::exp(-nll_test) - p_target;
  sum_sq_dp_ += dp * dp;
  sum_nll_test_ += nll_test;
  return {e.kl, top1};
}

ScoringStats ScoringAccumulator::finish() const {
  if (kl_.empty()) throw Error("metrics::ScoringAccumulator::finish: no positions were added");
  const double n = static_cast<double>(kl_.size());
  ScoringStats s{};
  s.n_positions = kl_.size();
  s.kld = summarize(kl_);
  s.max_p_tail = max_p_tail_;
  s.max_kl_gap_bound = max_gap_;
  s.top1_agreement = static_cast<double>(top1_agree_) / n;
  s.rms_delta_p = std::sqrt(sum_sq_dp_ / n);
  const double mean_ref = sum_nll_ref_ / n;
  const double mean_test = sum_nll_test_ / n;
  s.ppl_ref = std::exp(mean_ref);
  s.ppl_test = std::exp(mean_test);
  s.ppl_ratio = std::exp(mean_test - mean_ref);
  s.n_nonfinite_positions = nonfinite_;
  return s;
}

NearTieVerdict near_tie(std::span<const int32_t> ref_topk_ids,
                        std::span<const float> ref_topk_logits, int32_t test_token,
                        std::span<const float> test_logits, double margin_eps, int k) {
  constexpr const char* fn = "near_tie";
  require_nonempty(test_logits.size(), fn, "test_logits");
  require_vocab_fits(test_logits.size(), fn, "test_logits");
  if (ref_topk_ids.size() < 2) {
    throw Error("metrics::{}: ref_topk_ids has {} entries, need at least 2 for a margin", fn,
                ref_topk_ids.size());
  }
  validate_ref_topk(ref_topk_ids, ref_topk_logits, test_logits.size(), fn);
  if (test_token < 0 || static_cast<size_t>(test_token) >= test_logits.size()) {
    throw Error("metrics::{}: test_token = {} out of range [0, {}) (test_logits size)", fn,
                test_token, test_logits.size());
  }
  if (k <= 0) throw Error("metrics::{}: k = {} must be > 0", fn, k);
  if (std::isnan(margin_eps) || margin_eps < 0.0) {
    throw Error("metrics::{}: margin_eps = {} must be >= 0", fn, margin_eps);
  }

  const std::vector<size_t> order = rank_stored(ref_topk_ids, ref_topk_logits);
  const int32_t ref_token = ref_topk_ids[order[0]];
  NearTieVerdict v{};
  v.ref_margin = static_cast<double>(ref_topk_logits[order[0]]) -
                 static_cast<double>(ref_topk_logits[order[1]]);

  const size_t kr = std::min(static_cast<size_t>(k), order.size());
  v.test_in_ref_topk = false;
  for (size_t i = 0; i < kr; ++i)
    v.test_in_ref_topk = v.test_in_ref_topk || ref_topk_ids[order[i]] == test_token;

  // rank of ref_token in the test row = number of entries ranked before it
  const size_t rt = static_cast<size_t>(ref_token);
  size_t rank = 0;
  for (size_t j = 0; j < test_logits.size(); ++j) {
    if (j != rt && ranks_before(test_logits[j], j, test_logits[rt], rt)) ++rank;
  }
  v.ref_in_test_topk = rank < static_cast<size_t>(k);

  const bool finite = all_finite(test_logits);
  v.accepted = finite && (test_token == ref_token ||
                          (v.ref_margin < margin_eps && v.test_in_ref_topk && v.ref_in_test_topk));
  return v;
}

}  // namespace touchstone::metrics
