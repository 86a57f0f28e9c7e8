// parity_run_test.cpp - the parity run as a library: planning errors, the
// observer's calls in order on a real run, and how gtest_parity.h judges a
// report's rows.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/run/gtest_parity.h"
#include "touchstone/run/parity_run.h"

namespace {

using touchstone::ParityOptions;
using touchstone::ParityRun;
using touchstone::Report;

ParityOptions options() {
  ParityOptions o;
  o.manifest = TOUCHSTONE_RUN_MANIFEST;
  o.backend = "reference";
  return o;
}

TEST(ParityRunPlan, AnUnknownCaseIsAnErrorNamingIt) {
  ParityOptions o = options();
  o.cases = {"no_such_case"};
  try {
    ParityRun run(o);
    FAIL() << "planned a run with an unknown case";
  } catch (const touchstone::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_case"), std::string::npos) << e.what();
  }
}

TEST(ParityRunPlan, AnUnknownWeightPathIsAnErrorNamingIt) {
  ParityOptions o = options();
  o.weights = "int3";
  try {
    ParityRun run(o);
    FAIL() << "planned a run with weight path int3";
  } catch (const touchstone::Error& e) {
    EXPECT_NE(std::string(e.what()).find("int3"), std::string::npos) << e.what();
  }
}

struct Recorder : touchstone::ParityObserver {
  std::vector<std::string> events;
  void planned(size_t n, double) override { events.push_back("planned " + std::to_string(n)); }
  void check_started(const std::string& name, double) override {
    events.push_back("started " + name);
  }
  void check_finished(bool ok, double, double) override {
    events.push_back(ok ? "finished ok" : "finished FAIL");
  }
  void note(const std::string& line) override { events.push_back("note " + line); }
  void report_updated(const Report& r) override {
    events.push_back(r.complete ? "report complete" : "report");
  }
};

TEST(ParityRun, RunsOneCaseAndTellsTheObserverInOrder) {
  if (!std::filesystem::exists(TOUCHSTONE_RUN_MODEL))
    GTEST_SKIP() << "model not found: " << TOUCHSTONE_RUN_MODEL << " (ci/fetch_models.py)";
  ParityOptions o = options();
  o.cases = {"one_token"};
  ParityRun run(o);
  ASSERT_EQ(run.cases(), std::vector<std::string>{"one_token"});
  EXPECT_TRUE(run.scoring().empty());
  EXPECT_FALSE(run.runs_consistency());  // a named case: no golden-free checks by default
  Recorder rec;
  const Report r = run.run(rec);
  EXPECT_EQ(r.verdict(), "PASS");
  ASSERT_EQ(r.cases.size(), 1u);
  EXPECT_EQ(r.cases[0].name, "one_token");
  const std::vector<std::string> want = {"report",      "planned 1", "started one_token",
                                         "finished ok", "report",    "report complete"};
  EXPECT_EQ(rec.events, want);
}

// A backend computing wrongly: the library's report fails the case at its
// first step, and gtest_parity.h turns that row into a failing test.
TEST(ParityRun, AFaultyBackendFailsTheCaseAndItsTest) {
  if (!std::filesystem::exists(TOUCHSTONE_RUN_MODEL))
    GTEST_SKIP() << "model not found: " << TOUCHSTONE_RUN_MODEL << " (ci/fetch_models.py)";
  ParityOptions o = options();
  o.cases = {"narrative"};
  o.max_steps = 2;
  o.fault = "rope_base_off_1pct";
  ParityRun run(o);
  touchstone::ParityObserver quiet;
  const Report r = run.run(quiet);
  EXPECT_EQ(r.verdict(), "FAIL");
  ASSERT_EQ(r.cases.size(), 1u);
  EXPECT_FALSE(r.cases[0].acceptable());
  EXPECT_NONFATAL_FAILURE(touchstone::gtest_detail::judge(r, "narrative", false),
                          "narrative: FAIL");
}

// ---- gtest_parity.h's judgement of a report's rows
Report with_case(bool passed, std::vector<std::string> failures) {
  Report r;
  touchstone::CaseResult c;
  c.name = "narrative";
  c.passed = passed;
  c.failures = std::move(failures);
  r.cases.push_back(c);
  r.complete = true;
  r.n_planned = 1;
  return r;
}

TEST(GtestParity, AFailingRowFailsWithTheReportsLines) {
  const Report r = with_case(false, {"greedy: step 3 token 11 != golden 12"});
  EXPECT_NONFATAL_FAILURE(touchstone::gtest_detail::judge(r, "narrative", false),
                          "narrative: FAIL\n  greedy: step 3 token 11 != golden 12");
}

TEST(GtestParity, AKnownDivergencePasses) {
  Report r = with_case(false, {"top-1 agreement 0.875 < 0.9"});
  r.cases[0].known_divergence = touchstone::KnownDivergenceMatch{};
  r.cases[0].known_divergence->id = "reviewed-entry";
  touchstone::gtest_detail::judge(r, "narrative", false);
  EXPECT_FALSE(HasFailure());
}

// What judge() reports, intercepted (a skip stays a result of judge, not of this test).
std::vector<testing::TestPartResult> judged(const Report& r, const std::string& name, bool group) {
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter intercept(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    touchstone::gtest_detail::judge(r, name, group);
  }
  std::vector<testing::TestPartResult> out;
  for (int i = 0; i < results.size(); ++i) out.push_back(results.GetTestPartResult(i));
  return out;
}

TEST(GtestParity, ARunWithoutItsDeviceIsSkippedNamingWhy) {
  Report r;
  r.skipped = "no CUDA device";
  const auto res = judged(r, "narrative", false);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_TRUE(res[0].skipped());
  EXPECT_NE(std::string(res[0].message()).find("no CUDA device"), std::string::npos);
}

TEST(GtestParity, NotSupportedRowsOfAGroupAreSkippedNamingWhy) {
  Report r;
  r.not_supported.push_back({"serving.speculative_verify", "no all-position logits"});
  const auto res = judged(r, "serving", true);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_TRUE(res[0].skipped());
  EXPECT_NE(std::string(res[0].message()).find("serving.speculative_verify: NOT SUPPORTED"),
            std::string::npos)
      << res[0].message();
}

TEST(GtestParity, AGroupWithNoRowIsAFailure) {
  Report r;
  r.complete = true;
  EXPECT_NONFATAL_FAILURE(touchstone::gtest_detail::judge(r, "consistency", true),
                          "the run produced no row");
}

TEST(GtestParity, NamesBecomeGtestNames) {
  EXPECT_EQ(touchstone::gtest_detail::test_name("gemma3_alice-ch1.v2"), "gemma3_alice_ch1_v2");
}

}  // namespace
