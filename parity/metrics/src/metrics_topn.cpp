// kl_divergence_topn: the KL lower bound for top-N log-probability rows
// (definition in touchstone/metrics/metrics.h and docs/metrics.md#top-n-backends).
#include <algorithm>
#include <cmath>
#include <limits>

#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kUnreturnedSlack = 1e-6;

// p log(p / q) with 0 log 0 = 0 (q > 0 whenever p > 0 is the caller's job).
double term(double p, double q) { return p > 0 ? p * (std::log(p) - std::log(q)) : 0.0; }

}  // namespace

TopNKlEstimate kl_divergence_topn(std::span<const int32_t> ids, std::span<const float> vals,
                                  double ref_lse, std::span<const float> row) {
  if (ids.size() != vals.size() || ids.empty() || row.empty())
    throw Error("metrics::kl_divergence_topn: {} ids, {} logits, row of {}", ids.size(),
                vals.size(), row.size());
  if (!std::isfinite(ref_lse)) throw Error("metrics::kl_divergence_topn: ref_lse not finite");
  TopNKlEstimate e{kInf, 0, 0};
  double q_sum = 0.0, q_min = kInf;
  for (float v : row) {
    if (std::isnan(v) || v == kInf) return e;
    if (v == -kInf) continue;
    ++e.n_returned;
    const double q = std::exp(double(v));
    q_sum += q;
    q_min = std::min(q_min, q);
  }
  if (e.n_returned == 0) return e;
  double kl = 0.0, p_s = 0.0, p_m = 0.0, q_t = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || size_t(ids[i]) >= row.size())
      throw Error("metrics::kl_divergence_topn: id {} outside [0, {})", ids[i], row.size());
    const double p = std::exp(double(vals[i]) - ref_lse);
    p_s += p;
    const float t = row[size_t(ids[i])];
    if (t == -kInf) {
      p_m += p;
      ++e.n_missing;
    } else {
      kl += p * ((double(vals[i]) - ref_lse) - double(t));
      q_t += std::exp(double(t));
    }
  }
  const double p_tail = std::max(0.0, 1.0 - p_s);
  const double unreturned = std::max(1.0 - q_sum, kUnreturnedSlack);
  const double q_out = std::max(0.0, q_sum - q_t);  // returned, outside the reference's top-K
  const double c = q_out + unreturned;              // Q_M + Q_(not S)
  const double x_max = std::min(double(e.n_missing) * q_min, unreturned);
  double x = p_m + p_tail > 0 ? c * p_m / (p_m + p_tail) : 0.0;
  x = std::clamp(x, 0.0, x_max);
  if (p_m > 0 && x <= 0) return e;  // the reference's tokens have no room: unbounded
  kl += term(p_m, x) + (p_tail > 0 ? term(p_tail, c - x) : 0.0);
  e.kl = std::max(0.0, kl);
  return e;
}

}  // namespace touchstone::metrics
