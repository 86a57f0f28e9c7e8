// The test-only --expect-* checks of `touchstone parity` (expect.h).
#include "expect.h"

#include <fmt/format.h>

#include "cli_common.h"
#include "touchstone/model/faults.h"

namespace touchstone::cli {

bool expect_fail_caught(const Report& report) {
  bool caught = !report.passed();
  for (const CaseResult& c : report.cases) {
    const bool named =
        (c.first_divergence && !c.first_divergence->accepted) || c.first_logit_violation_step >= 0;
    if (!c.passed && !named) caught = false;
  }
  return caught;
}

// --expect-step N | CHECK | CHECK@N: every failing result is the named check
// (if named) and first fails at step / position N (if given): a case's first
// logit violation (else its first unaccepted divergence), a scoring passage's
// first failing position, a consistency check's first failing position.
bool expect_step_met(const Report& report, const std::string& spec_in) {
  // A trailing '+': the named check must fail (first at the step, if given);
  // other failing results are allowed too (a fault that breaks several checks).
  const bool others_ok = spec_in.ends_with('+');
  const std::string spec = others_ok ? spec_in.substr(0, spec_in.size() - 1) : spec_in;
  const size_t at = spec.find('@');
  const bool digits_only = spec.find_first_not_of("0123456789") == std::string::npos;
  const std::string check = digits_only ? "" : spec.substr(0, at);
  const std::string step_text = digits_only               ? spec
                                : at == std::string::npos ? ""
                                                          : spec.substr(at + 1);
  const int want = step_text.empty() ? -1 : std::stoi(step_text);
  bool any = false, ok = true, named = false;
  auto match = [&](const std::string& name, int step) {
    any = true;
    const bool is_check = check.empty() || name == check;
    const bool m = is_check && (want < 0 || step == want);
    if (is_check && m) named = true;
    const bool allowed = m || (others_ok && !is_check);
    fmt::print("expect-step: {} fails first at step {}{}\n", name, step,
               allowed ? "" : " (not expected)");
    ok = ok && allowed;
  };
  for (const CaseResult& c : report.cases) {
    if (c.passed) continue;
    const int div =
        c.first_divergence && !c.first_divergence->accepted ? c.first_divergence->step : -1;
    match(c.name, c.first_logit_violation_step >= 0 ? c.first_logit_violation_step : div);
  }
  for (const ScoringResult& sr : report.scoring)
    if (!sr.passed) match(sr.name, sr.first_failing_position);
  return any && ok && (!others_ok || named);
}

namespace {

const char* const kPointShort[] = {"attn", "ffn", "resid"};

}  // namespace

std::string expect_layer_spec_error(const std::string& v) {
  if (v == "after") return "";
  const size_t colon = v.find(':');
  const std::string layer = v.substr(0, colon);
  const std::string point = colon == std::string::npos ? "" : v.substr(colon + 1);
  const bool ok = !layer.empty() && layer.size() < 6 &&
                  layer.find_first_not_of("0123456789") == std::string::npos &&
                  (point == "attn" || point == "ffn" || point == "resid");
  return ok ? "" : "L:attn, L:ffn, L:resid (L a layer number) or after";
}

bool expect_layer_met(const Report& report, const std::string& spec) {
  bool any = false, ok = true;
  for (const CaseResult& c : report.cases) {
    if (c.passed) continue;
    any = true;
    std::string got = "no layer taps compared";
    if (c.first_layer_divergence) {
      const LayerDivergence& l = *c.first_layer_divergence;
      got = fmt::format("{}:{}", l.layer, kPointShort[l.point]);
    } else if (c.tap_steps_compared > 0 || !c.layer_locus.empty()) {
      got = "after";  // taps compared where the logits broke, every one matched
    }
    const bool m = got == spec;
    fmt::print("expect-layer: {}: first divergent layer tap {}{}\n", c.name, got,
               m ? "" : " (not expected)");
    ok = ok && m;
  }
  return any && ok;
}

// Test only: a fault injected, and what its run must report.
void add_expect_options(CLI::App* cmd, ExpectOptions* o, std::string* fault) {
  cmd->add_option("--fault", *fault,
                  "Test only: inject a named fault into the backend (the catalog: "
                  "docs/metrics.md#fault-catalog-and-margins)")
      ->check(CLI::IsMember(fault_names()));
  CLI::Option* expect_fail = cmd->add_flag(
      "--expect-fail", o->expect_fail,
      "Test only: succeed iff the verdict is FAIL and every failing case names its first "
      "divergent step");
  cmd->add_option("--expect-step", o->expect_step,
                  "Test only, with --expect-fail: every failing check must fail first at this "
                  "step / position N, or be the named check (CHECK, e.g. consistency.threads), "
                  "or both (CHECK@N); a trailing '+' (CHECK@N+): CHECK must fail so, other "
                  "checks may fail too")
      ->check([](const std::string& spec) {
        const std::string v =
            spec.size() > 1 && spec.ends_with('+') ? spec.substr(0, spec.size() - 1) : spec;
        const size_t at = v.find('@');
        const std::string n = v.find_first_not_of("0123456789") == std::string::npos ? v
                              : at == std::string::npos                              ? "0"
                                                        : v.substr(at + 1);
        return !n.empty() && n.size() < 9 && n.find_first_not_of("0123456789") == std::string::npos
                   ? std::string()
                   : std::string(
                         "N, CHECK or CHECK@N, optionally with a trailing '+' (N a step number)");
      })
      ->needs(expect_fail);
  cmd->add_option("--expect-layer", o->expect_layer,
                  "Test only, with --expect-fail: every failing case's first divergent layer tap "
                  "is L:attn, L:ffn or L:resid, or 'after' (every tap matches: the fault is past "
                  "the last layer)")
      ->check([](const std::string& v) { return expect_layer_spec_error(v); })
      ->needs(expect_fail);
}

int expect_exit_code(const ExpectOptions& o, const std::string& fault, const Report& report) {
  const bool caught = expect_fail_caught(report);
  fmt::print("expect-fail: fault {} {}\n", fault.empty() ? "(none)" : fault,
             caught ? "was caught, first divergent steps named" : "was NOT caught");
  if (caught && !o.expect_step.empty() && !expect_step_met(report, o.expect_step)) {
    fmt::print("expect-step: expected {}: NOT met\n", o.expect_step);
    return kExitFail;
  }
  if (caught && !o.expect_layer.empty() && !expect_layer_met(report, o.expect_layer)) {
    fmt::print("expect-layer: expected {}: NOT met\n", o.expect_layer);
    return kExitFail;
  }
  return caught ? 0 : kExitFail;
}

}  // namespace touchstone::cli
