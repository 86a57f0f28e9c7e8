// expect.h - the test-only --expect-* checks of `touchstone parity`: a run with
// an injected fault passes only if the harness failed it and said where.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "touchstone/report/report.h"

namespace touchstone::cli {

// What a run with an injected fault must report.
struct ExpectOptions {
  bool expect_fail = false;
  std::string expect_step;   // --expect-step: N, CHECK or CHECK@N
  std::string expect_layer;  // --expect-layer: L:attn|ffn|resid, or after
};

// --fault (into *fault), --expect-fail, --expect-step, --expect-layer.
void add_expect_options(CLI::App* cmd, ExpectOptions* o, std::string* fault);

// The exit code of a finished report under --expect-fail: 0 when the fault was
// caught (and --expect-step / --expect-layer met), else kExitFail; prints why.
int expect_exit_code(const ExpectOptions& o, const std::string& fault, const Report& report);

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
