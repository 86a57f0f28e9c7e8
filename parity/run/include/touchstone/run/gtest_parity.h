// gtest_parity.h - a backend's parity checks as GoogleTest tests, in the
// user's own test binary (header-only: link GoogleTest and
// touchstone_parity_run).
//
//   int main(int argc, char** argv) {
//     ::testing::InitGoogleTest(&argc, argv);
//     touchstone::ParityOptions o;
//     o.backend = "/path/to/libmy_backend.so";
//     o.weights = "quantized";
//     touchstone::register_parity_tests("MyBackendParity", o);
//     return RUN_ALL_TESTS();
//   }
//
// register_parity_tests plans the run (touchstone::ParityRun: manifest,
// goldens, tokenizer; a planning error becomes one failing test,
// <suite>.plan, naming it) and registers, in run order:
//   <suite>.<case>         one per planned case (greedy parity)
//   <suite>.<passage>      one per planned scoring passage (teacher-forced)
//   <suite>.consistency    the golden-free consistency checks, when planned
//   <suite>.serving        the serving checks (emulated where the backend has
//                          no step_batch / fork_session), unless no_serving
//   <suite>.structured     the structured-output checks, when asked for
// (characters other than [A-Za-z0-9_] in a name become '_'). Each test runs
// its own part of the plan with the trims the whole run applies, so one test
// run alone (ctest, --gtest_filter) checks what it checks in the full run.
// A row that is not acceptable fails the test with the report's failure
// lines; a reviewed known divergence passes and is recorded as the test
// property "known_divergence"; a NOT SUPPORTED row, a run without its device
// (SKIP) or a backend that refuses the model or weight path (UNSUPPORTED) is
// a skipped test naming the reason.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "touchstone/run/parity_run.h"

namespace touchstone {
namespace gtest_detail {

inline std::string test_name(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '_';
  return out;
}

// The rows of `r` whose name is `name` or, for a group, starts with it.
inline void judge(const Report& r, const std::string& name, bool group) {
  if (!r.skipped.empty()) GTEST_SKIP() << "SKIP: " << r.skipped;
  if (!r.unsupported.empty()) GTEST_SKIP() << "UNSUPPORTED: " << r.unsupported;
  auto mine = [&](const std::string& n) {
    return n == name || (group && n.rfind(name + ".", 0) == 0);
  };
  int rows = 0;
  auto one = [&](const auto& row) {
    if (!mine(row.name)) return;
    ++rows;
    if (row.passed) return;
    if (row.known_divergence) {
      ::testing::Test::RecordProperty(
          "known_divergence",
          row.name + ": " + row.known_divergence->id + " (" + row.known_divergence->source + ")");
      return;
    }
    std::string lines;
    for (const std::string& f : row.failures) lines += "\n  " + f;
    ADD_FAILURE() << row.name << ": FAIL" << lines;
  };
  for (const CaseResult& c : r.cases) one(c);
  for (const ScoringResult& s : r.scoring) one(s);
  std::string skipped;
  for (const NotSupportedCheck& n : r.not_supported)
    if (mine(n.check)) skipped += "\n  " + n.check + ": NOT SUPPORTED: " + n.reason;
  if (rows == 0 && !skipped.empty()) GTEST_SKIP() << skipped.substr(3);
  if (rows == 0)
    ADD_FAILURE() << name << ": the run produced no row (verdict " << r.verdict() << ")";
  if (!skipped.empty()) ::testing::Test::RecordProperty("not_supported", skipped.substr(3));
}

class PartTest : public ::testing::Test {
 public:
  PartTest(ParityOptions o, std::string name, bool group)
      : o_(std::move(o)), name_(std::move(name)), group_(group) {}
  void TestBody() override {
    ParityRun run(o_);
    ParityObserver quiet;
    judge(run.run(quiet), name_, group_);
  }

 private:
  ParityOptions o_;
  std::string name_;
  bool group_;
};

// The options of one part: nothing else of the plan, the whole run's trims.
inline ParityOptions part(const ParityOptions& o) {
  ParityOptions p = o;
  p.cases.clear();
  p.scoring.clear();
  p.skip_cases.clear();
  p.no_scoring = false;
  p.consistency = p.consistency_only = p.serving = p.serving_only = false;
  p.structured = p.structured_only = false;
  p.no_consistency = p.no_serving = true;
  p.structured_checks.clear();
  return p;
}

inline void add(const std::string& suite, const std::string& name, ParityOptions o,
                const std::string& row, bool group) {
  ::testing::RegisterTest(
      suite.c_str(), test_name(name).c_str(), nullptr, nullptr, __FILE__, __LINE__,
      [o = std::move(o), row, group]() -> ::testing::Test* { return new PartTest(o, row, group); });
}

}  // namespace gtest_detail

// Registers the parity tests of `options` under suite `suite` (see above).
// Call after ::testing::InitGoogleTest and before RUN_ALL_TESTS.
inline void register_parity_tests(const std::string& suite, const ParityOptions& options) {
  using namespace gtest_detail;
  std::unique_ptr<ParityRun> plan;
  try {
    plan = std::make_unique<ParityRun>(options);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    ::testing::RegisterTest(suite.c_str(), "plan", nullptr, nullptr, __FILE__, __LINE__, [what] {
      struct Failed : ::testing::Test {
        explicit Failed(std::string w) : w_(std::move(w)) {}
        void TestBody() override { FAIL() << "planning the parity run: " << w_; }
        std::string w_;
      };
      return static_cast<::testing::Test*>(new Failed(what));
    });
    return;
  }
  if (!options.consistency_only && !options.serving_only && !options.structured_only) {
    for (const std::string& c : plan->cases()) {
      ParityOptions p = part(options);
      p.cases = {c};
      p.max_steps = plan->case_max_steps() > 0 ? plan->case_max_steps() : 0;
      p.no_scoring = true;
      add(suite, c, p, c, false);
    }
    for (const std::string& s : plan->scoring()) {
      ParityOptions p = part(options);
      p.scoring = {s};
      p.max_positions = plan->passage_max_positions(s);
      add(suite, s, p, s, false);
    }
  }
  if (plan->runs_consistency()) {
    ParityOptions p = part(options);
    p.no_consistency = false;
    p.consistency_only = true;
    p.consistency_tokens = options.consistency_tokens;
    add(suite, "consistency", p, "consistency", true);
  }
  if (!options.no_serving && !options.consistency_only && !options.structured_only) {
    ParityOptions p = part(options);
    p.no_serving = false;
    p.serving_only = true;
    p.serving_checks = options.serving_checks;
    add(suite, "serving", p, "serving", true);
  }
  if (plan->runs_structured()) {
    ParityOptions p = part(options);
    p.structured_only = true;
    p.structured_checks = options.structured_checks;
    add(suite, "structured", p, "structured", true);
  }
}

}  // namespace touchstone
