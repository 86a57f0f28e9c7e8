// row_compare.cpp - see row_compare.h.
#include "row_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "touchstone/metrics/metrics.h"

namespace touchstone::detail {
void note_violation(CaseResult& r, const std::string& check, double value, double limit) {
  for (Violation& v : r.violations) {
    if (v.check == check) {
      v.value = std::max(v.value, value);
      return;
    }
  }
  r.violations.push_back({check, value, limit});
}

namespace {

bool is_top_n(std::span<const float> row) {
  return std::any_of(row.begin(), row.end(), [](float v) { return v == -INFINITY; });
}

// The smallest listed (finite) value of a top-N row.
double smallest_listed(std::span<const float> row) {
  double m = INFINITY;
  for (float v : row)
    if (std::isfinite(v)) m = std::min(m, double(v));
  return m;
}

RowDiff top_n_diff(std::span<const float> a, std::span<const float> b) {
  RowDiff d;
  const double min_a = smallest_listed(a), min_b = smallest_listed(b);
  double err = 0.0, energy = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float x = a[i], y = b[i];
    if (std::isnan(y) || y == INFINITY) {
      ++d.non_finite;
      continue;
    }
    const bool in_a = std::isfinite(x), in_b = std::isfinite(y);
    double diff = 0.0;
    if (in_a && in_b) {
      diff = std::abs(double(x) - double(y));
    } else if (in_a) {
      diff = std::max(0.0, double(x) - min_b);
    } else if (in_b) {
      diff = std::max(0.0, double(y) - min_a);
    }
    if (in_a) energy += double(x) * double(x);
    err += diff * diff;
    d.max_abs = std::max(d.max_abs, diff);
  }
  d.nmse = energy > 0 ? err / energy : (err > 0 ? INFINITY : 0.0);
  return d;
}

}  // namespace

RowDiff row_diff(std::span<const float> ref, std::span<const float> test) {
  if (is_top_n(ref)) return top_n_diff(ref, test);
  return {metrics::nmse(ref, test), metrics::max_abs_diff(ref, test),
          metrics::count_nonfinite(test)};
}

bool compare_row(std::span<const float> a, std::span<const float> row, int position, bool bitwise,
                 const std::string& claim, const Profile& p, const std::string& where,
                 CaseResult& r) {
  ++r.n_steps;
  r.n_total = r.n_steps;
  const RowDiff d = row_diff(a, row);
  const double nmse = d.nmse, diff = d.max_abs;
  r.nmse_max = std::max(r.nmse_max, nmse);
  r.max_abs = std::max(r.max_abs, diff);
  std::string why;
  if (d.non_finite != 0) {
    why = "NaN/Inf logits";
    note_violation(r, "non_finite", double(d.non_finite), 0.0);
  } else if (bitwise && std::memcmp(a.data(), row.data(), a.size() * sizeof(float)) != 0) {
    why = fmt::format("not bitwise identical (max |diff| {:.3g}) although the backend claims {}",
                      diff, claim);
    note_violation(r, "bitwise", diff, 0.0);
  } else if (p.logits_nmse_max && nmse > *p.logits_nmse_max) {
    why = fmt::format("NMSE {:.3g} > {:.3g}", nmse, *p.logits_nmse_max);
    note_violation(r, "logits_nmse", nmse, *p.logits_nmse_max);
  } else if (p.logits_max_abs_max && diff > *p.logits_max_abs_max) {
    why = fmt::format("max |diff| {:.3g} > {:.3g}", diff, *p.logits_max_abs_max);
    note_violation(r, "logits_max_abs", diff, *p.logits_max_abs_max);
  } else if (metrics::argmax(a) != metrics::argmax(row) &&
             metrics::top2_margin(a) >= p.near_tie_margin) {
    why = fmt::format("argmax {} vs {} (top-2 margin {:.3g})", metrics::argmax(row),
                      metrics::argmax(a), metrics::top2_margin(a));
    note_violation(r, "argmax", metrics::top2_margin(a), p.near_tie_margin);
  } else {
    ++r.n_matched;
    return true;
  }
  if (r.first_logit_violation_step < 0) {
    r.first_logit_violation_step = position;
    r.first_logit_violation = why + where;
  }
  return false;
}

void finish_rows(CaseResult& r, const std::string& what) {
  if (r.first_logit_violation_step >= 0) {
    r.failures.push_back(fmt::format("{}: position {}: {}", what, r.first_logit_violation_step,
                                     r.first_logit_violation));
    if (std::string l = layer_line(r); !l.empty()) r.failures.push_back(std::move(l));
  }
  r.passed = r.failures.empty() && r.backend_error.empty();
}

}  // namespace touchstone::detail
