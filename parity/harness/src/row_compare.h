// row_compare.h - one logits row against another, for the golden-free checks
// (consistency.cpp, serving_*.cpp): bitwise or within the profile.
#pragma once

#include <span>
#include <string>

#include "touchstone/golden/manifest.h"
#include "touchstone/harness/parity.h"

namespace touchstone::detail {

// How far `test` is from `ref`. A row is either a full logits row or a top-N
// row (TS_CAP_TOP_N_LOGPROBS: natural-log probabilities of the listed tokens,
// -INFINITY elsewhere); `ref` holding a -INFINITY makes both top-N rows. Full
// rows: metrics::nmse / max_abs_diff, and every NaN / +-Inf of test counted.
// Top-N rows: NMSE and max |diff| over the tokens both rows list; a token only
// one row lists (a rank-N boundary change) adds the lower bound of its
// difference, its value minus the other row's smallest listed value (0 when
// below it); NaN / +Inf of test counted.
struct RowDiff {
  double nmse = 0.0;
  double max_abs = 0.0;
  size_t non_finite = 0;
};
RowDiff row_diff(std::span<const float> ref, std::span<const float> test);

// Compares `test` with `ref` (one logits row each, or one top-N row each, see row_diff) and counts
// it in r: a step compared, NMSE / max |diff| maxima, a match or the first violation (at
// `position`, its text followed by `where`). Rules, in order: non-finite
// logits; not bitwise identical when `bitwise` (`claim` names why bits are
// required); NMSE or max |diff| over the profile; a different argmax unless the
// reference's top-2 margin is under near_tie_margin. A violation is also kept in
// r.violations, one per kind with its worst value ("non_finite", "bitwise":
// max |diff|, "logits_nmse", "logits_max_abs", "argmax": the top-2 margin), so
// that a reviewed known divergence can name it. Returns true when it matched.
bool compare_row(std::span<const float> ref, std::span<const float> test, int position,
                 bool bitwise, const std::string& claim, const Profile& p, const std::string& where,
                 CaseResult& r);

// Keeps one violation per check in r, with the worst value seen.
void note_violation(CaseResult& r, const std::string& check, double value, double limit);

// Sets r.passed; a violation becomes a failure line "<what>: position N: <why>",
// followed by the located layer's line when the serving checks located it.
void finish_rows(CaseResult& r, const std::string& what);

// The failure line of r's located first divergent layer (r.layer_locus;
// serving_taps.cpp), "" when not located.
std::string layer_line(const CaseResult& r);

}  // namespace touchstone::detail
