// ctest_faults.cpp - the fault CTests of a backend file's faults[] entries
// (touchstone/run/ctest_plan.h; expectations: touchstone/run/fault_expectations.h).
//
// One test fault.<b>.<w>.<fault> per fault, on one short case (narrative, 4
// greedy steps; structured_answer for the structured faults) so each costs
// about a second. By its EXPECT:
//   pass           the run must PASS with the fault set (a quantized-only
//                  fault on full_precision)
//   consistency.*  only the consistency checks run (8 tokens), the named one must fail
//   structured.*   only the named structured check runs, on structured_answer
//   serving.*      only the named serving check runs (quick plan)
//   STEP[/TAP]     the goldens must catch it at STEP (and the layer tap TAP)
#include <fmt/format.h>

#include <algorithm>
#include <regex>

#include "ctest_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/run/fault_expectations.h"

namespace touchstone::ctest {
namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::ranges::count(v, s) > 0;
}

// The entry's faults with their EXPECT, in set order.
std::vector<FaultExpectation> entry_faults(const BackendFile& b, const BackendFaultEntry& e,
                                           const std::string& ptr) {
  std::vector<FaultExpectation> out;
  for (const std::string& set : e.sets)
    for (const FaultExpectation& f : fault_expectations(set))
      if ((e.only.empty() || has(e.only, f.fault)) && !has(e.exclude, f.fault)) out.push_back(f);
  for (const auto& [fault, expect] : e.expect) {
    const auto it = std::ranges::find(out, fault, &FaultExpectation::fault);
    if (it == out.end())
      throw Error("{}: {}/expect/{}: not a fault of this entry's sets", b.path, ptr, fault);
    it->expect = expect;
  }
  for (const std::vector<std::string>* names : {&e.only, &e.slow})
    for (const std::string& n : *names)
      if (std::ranges::count(out, n, &FaultExpectation::fault) == 0)
        throw Error("{}: {}: '{}' is not a fault of this entry's sets (or is excluded)", b.path,
                    ptr, n);
  return out;
}

// The flags that select and judge the run for EXPECT, and its case and processors.
struct Mode {
  std::vector<std::string> flags;
  std::string case_name = "narrative";
  int processors = 1;
};

Mode fault_mode(std::string expect, int max_steps) {
  std::vector<std::string> layer;
  std::smatch m;
  if (std::regex_match(expect, m, std::regex("^([^/]+)/(.+)$"))) {
    layer = {"--expect-layer", m[2].str()};
    expect = m[1].str();
  }
  const std::string steps = std::to_string(max_steps);
  const std::vector<std::string> judge = {"--expect-fail", "--expect-step", expect};
  Mode mode;
  auto& f = mode.flags;
  if (expect == "pass") {
    f = {"--no-scoring", "--no-consistency", "--max-steps", steps, "--threads", "1"};
  } else if (expect.starts_with("consistency")) {
    f = {"--consistency-only", "--consistency-tokens", "8"};
    f.insert(f.end(), judge.begin(), judge.end());
    mode.processors = 2;
  } else if (std::regex_search(expect, m, std::regex("^(structured\\.[a-z_]+)"))) {
    f = {"--structured-only", "--structured-check", m[1].str(), "--threads", "1"};
    f.insert(f.end(), judge.begin(), judge.end());
    mode.case_name = "structured_answer";
  } else if (std::regex_search(expect, m, std::regex("^(serving\\.[a-z_]+)"))) {
    f = {"--serving-only", "--serving-plan", "quick", "--serving-check",
         m[1].str(),       "--threads",      "1"};
    f.insert(f.end(), judge.begin(), judge.end());
    f.insert(f.end(), layer.begin(), layer.end());
  } else {
    f = {"--no-scoring", "--no-consistency", "--max-steps", steps, "--threads", "1"};
    f.insert(f.end(), judge.begin(), judge.end());
    f.insert(f.end(), layer.begin(), layer.end());
  }
  return mode;
}

}  // namespace

void add_fault_tests(const Gen& g) {
  for (size_t i = 0; i < g.b.faults.size(); ++i) {
    const BackendFaultEntry& e = g.b.faults[i];
    for (const FaultExpectation& f : entry_faults(g.b, e, fmt::format("/faults/{}", i))) {
      const Mode mode = fault_mode(f.expect, e.max_steps > 0 ? e.max_steps : 4);
      const std::string t = fmt::format("fault.{}.{}.{}", g.b.name, e.weights, f.fault);
      std::vector<std::string> cmd = {g.ctx.cli,   "parity",      "--backend", g.backend_arg,
                                      "--weights", e.weights,     "--fault",   f.fault,
                                      "--case",    mode.case_name};
      cmd.insert(cmd.end(), mode.flags.begin(), mode.flags.end());
      cmd.insert(cmd.end(), {"--manifest", g.ctx.manifest});
      std::vector<std::string> labels = {"fault", g.b.name, e.weights};
      if (has(e.slow, f.fault)) labels.push_back("slow");
      g.out.push_back(skippable(t, cmd, labels, g.ctx.one_thread_env, 300, mode.processors));
    }
  }
}

}  // namespace touchstone::ctest
