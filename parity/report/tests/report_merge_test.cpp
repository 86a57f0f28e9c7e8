// report_merge_test.cpp - shard reports merged into their plan's report: the
// same rows and verdict as the unsharded report, and every kind of input that
// cannot be merged refused with the source and field named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "touchstone/common/error.h"
#include "touchstone/report/report.h"
#include "touchstone/report/report_merge.h"

namespace {

using namespace touchstone;
using nlohmann::json;

const std::vector<std::string> kPlan = {"case:a", "case:b", "scoring:p", "consistency"};

CaseResult row(const std::string& name, bool passed, double seconds) {
  CaseResult c;
  c.name = name;
  c.passed = passed;
  c.n_steps = c.n_total = c.n_matched = 4;
  c.seconds = seconds;
  if (!passed) c.failures.push_back("argmax differs at step 2");
  return c;
}

ScoringResult passage(const std::string& name) {
  ScoringResult s;
  s.name = name;
  s.passed = true;
  s.stats.n_positions = 8;
  return s;
}

// The report a run of `items` writes (one shard when count > 0), rows in plan order.
Report run_of(const std::vector<std::string>& items, int index, int count, bool b_passes = true) {
  Report r;
  r.info.backend = "cpu_simd";
  r.info.model_name = "smollm2";
  r.complete = true;
  auto has = [&](const std::string& i) { return std::ranges::count(items, i) > 0; };
  if (has("case:a")) r.cases.push_back(row("a", true, 1.0));
  if (has("case:b")) r.cases.push_back(row("b", b_passes, 2.0));
  if (has("consistency")) r.cases.push_back(row("consistency.threads", true, 3.0));
  if (has("scoring:p")) r.scoring.push_back(passage("p"));
  r.n_planned = int(r.cases.size() + r.scoring.size());
  if (count > 0) r.shard = ShardInfo{index, count, "plan1", "gold1", kPlan, items, "node"};
  return r;
}

json rows_without_seconds(const json& j, const char* key) {
  json out = j[key];
  for (json& row : out) row.erase("seconds");
  return out;
}

std::vector<std::pair<std::string, std::string>> shards(bool b_passes = true) {
  return {{"s1.json", to_json(run_of({"case:b", "consistency"}, 1, 2, b_passes))},
          {"s0.json", to_json(run_of({"case:a", "scoring:p"}, 0, 2))}};
}

TEST(ReportMerge, EqualsTheUnshardedReport) {
  const json whole = json::parse(to_json(run_of(kPlan, 0, 0)));
  const MergedReport m = merge_shard_reports(shards());
  const json merged = json::parse(m.json);
  EXPECT_EQ(m.verdict, "PASS");
  EXPECT_TRUE(m.missing.empty());
  for (const char* key : {"cases", "scoring", "not_supported"})
    EXPECT_EQ(rows_without_seconds(merged, key), rows_without_seconds(whole, key)) << key;
  EXPECT_EQ(merged["checks_planned"], whole["checks_planned"]);
  EXPECT_EQ(merged["verdict"], whole["verdict"]);
  EXPECT_FALSE(merged.contains("shard"));
  ASSERT_EQ(merged["shards"].size(), 2u);
  EXPECT_EQ(merged["shards"][0]["index"], 0);
}

TEST(ReportMerge, AFailingRowInAnyShardFailsThePlan) {
  const MergedReport m = merge_shard_reports(shards(false));
  EXPECT_EQ(m.verdict, "FAIL");
  EXPECT_EQ(json::parse(m.json)["passed"], false);
}

TEST(ReportMerge, AMissingOrUnfinishedShardIsIncompleteNeverPass) {
  auto s = shards();
  s.pop_back();  // shard 0 missing
  MergedReport m = merge_shard_reports(s);
  EXPECT_EQ(m.verdict, "INCOMPLETE");
  ASSERT_EQ(m.missing.size(), 1u);
  EXPECT_NE(m.missing[0].find("shard 0 of 2 is missing"), std::string::npos);
  Report unfinished = run_of({"case:a", "scoring:p"}, 0, 2);
  unfinished.complete = false;
  s.emplace_back("s0.json", to_json(unfinished));
  m = merge_shard_reports(s);
  EXPECT_EQ(m.verdict, "INCOMPLETE");
  EXPECT_NE(json::parse(m.json)["reason"].get<std::string>().find("did not finish"),
            std::string::npos);
}

void expect_error(const std::vector<std::pair<std::string, std::string>>& s,
                  const std::string& needle) {
  try {
    merge_shard_reports(s);
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ReportMerge, RefusesWhatCannotBeMerged) {
  auto s = shards();
  expect_error({{"t.json", s[0].second.substr(0, 200)}}, "t.json: not a JSON report (truncated");
  expect_error({{"u.json", to_json(run_of(kPlan, 0, 0))}}, "u.json: /shard: missing");
  Report other = run_of({"case:a", "scoring:p"}, 0, 2);
  other.shard->plan_digest = "plan2";
  expect_error({s[0], {"o.json", to_json(other)}}, "o.json: /shard/plan_digest");
  other = run_of({"case:a", "scoring:p"}, 0, 2);
  other.shard->goldens_digest = "gold2";
  expect_error({s[0], {"g.json", to_json(other)}}, "other goldens");
  other = run_of({"case:a", "scoring:p"}, 0, 3);
  expect_error({s[0], {"c.json", to_json(other)}}, "c.json: /shard/count: 3 shards");
  expect_error({s[0], {"d.json", s[0].second}}, "s1.json and d.json are both shard 1 of 2");
  other = run_of({"case:a", "case:b"}, 0, 2);
  expect_error({s[0], {"x.json", to_json(other)}}, "s1.json and x.json both claim item 'case:b'");
  other = run_of({"case:a", "case:z"}, 0, 2);
  expect_error({s[0], {"z.json", to_json(other)}}, "'case:z' is not an item of the plan");
  json bad = json::parse(s[1].second);
  bad["shard"]["index"] = 5;
  expect_error({{"i.json", bad.dump()}}, "i.json: /shard/index: 5 is outside 0..1");
  bad["shard"]["index"] = "0";
  expect_error({{"i.json", bad.dump()}}, "i.json: /shard/index: expected an integer");
}

}  // namespace
