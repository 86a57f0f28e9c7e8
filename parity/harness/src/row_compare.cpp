// row_compare.cpp - see row_compare.h.
#include "row_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "touchstone/metrics.h"

namespace touchstone::detail {
namespace {

// Keeps one violation per check in r, with the worst value seen.
void note_violation(CaseResult& r, const std::string& check, double value, double limit) {
  for (Violation& v : r.violations) {
    if (v.check == check) {
      v.value = std::max(v.value, value);
      return;
    }
  }
  r.violations.push_back({check, value, limit});
}

}  // namespace

bool compare_row(std::span<const float> a, std::span<const float> row, int position, bool bitwise,
                 const std::string& claim, const Profile& p, const std::string& where,
                 CaseResult& r) {
  ++r.n_steps;
  r.n_total = r.n_steps;
  const double nmse = metrics::nmse(a, row), diff = metrics::max_abs_diff(a, row);
  r.nmse_max = std::max(r.nmse_max, nmse);
  r.max_abs = std::max(r.max_abs, diff);
  std::string why;
  if (metrics::count_nonfinite(row) != 0) {
    why = "NaN/Inf logits";
    note_violation(r, "non_finite", double(metrics::count_nonfinite(row)), 0.0);
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
  }
  r.passed = r.failures.empty() && r.backend_error.empty();
}

}  // namespace touchstone::detail
