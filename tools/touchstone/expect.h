// expect.h - the test-only --expect-* checks of `touchstone parity`: a run with
// an injected fault passes only if the harness failed it and said where.
#pragma once

#include <string>

#include "touchstone/report/report.h"

namespace touchstone::cli {

// --expect-fail: the verdict is FAIL and every failing case names its first
// divergent step (a logit violation or an unaccepted greedy flip).
bool expect_fail_caught(const Report& report);

// --expect-step N | CHECK | CHECK@N: every failing result is the named check
// (if named) and first fails at step / position N (if given): a case's first
// logit violation (else its first unaccepted divergence), a scoring passage's
// first failing position, a consistency check's first failing position.
// CHECK@N+ : CHECK must fail first at N, other results may fail as well.
bool expect_step_met(const Report& report, const std::string& spec);

// --expect-layer L:attn | L:ffn | L:resid | after: every failing case's first
// divergent layer tap (parity.h LayerDivergence) is that layer and point, or,
// for "after", its taps were compared and none diverged.
bool expect_layer_met(const Report& report, const std::string& spec);
// "" when `spec` is well-formed, else what is expected (for CLI11's check).
std::string expect_layer_spec_error(const std::string& spec);

}  // namespace touchstone::cli
