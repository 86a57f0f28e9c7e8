// shard_test.cpp - shard specs from flags and fleet environments, the
// deterministic split of a plan, the durations file, and a ParityRun's shards
// partitioning its plan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "touchstone/common/error.h"
#include "touchstone/run/parity_run.h"
#include "touchstone/run/shard.h"

namespace {

using touchstone::Environment;
using touchstone::parse_shard;
using touchstone::PlanItem;

void expect_error(const std::string& spec, const Environment& env, const std::string& needle) {
  try {
    parse_shard(spec, env);
    ADD_FAILURE() << spec << ": no error; expected one containing: " << needle;
  } catch (const touchstone::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Shard, ExplicitIndexAndCount) {
  EXPECT_FALSE(parse_shard("", {}).sharded());
  const auto s = parse_shard("2/4", {});
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
  expect_error("4/4", {}, "index 4 is outside 0..3");
  expect_error("1/0", {}, "the count must be 1..4096");
  expect_error("x/4", {}, "--shard index: 'x'");
  expect_error("3", {}, "expected I/N, auto or auto/N");
  expect_error("-1/4", {}, "--shard index: '-1'");
}

TEST(Shard, IndexFromTheFleetsEnvironment) {
  // Slurm: --array=10-13 gives ids 10..13, min 10, count 4.
  auto s = parse_shard("auto", {{"SLURM_ARRAY_TASK_ID", "12"},
                                {"SLURM_ARRAY_TASK_MIN", "10"},
                                {"SLURM_ARRAY_TASK_COUNT", "4"}});
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
  s = parse_shard("auto/3", {{"JOB_COMPLETION_INDEX", "1"}});  // Kubernetes: count from the flag
  EXPECT_EQ(s.index, 1);
  EXPECT_EQ(s.count, 3);
  s = parse_shard("auto", {{"BUILDKITE_PARALLEL_JOB", "0"}, {"BUILDKITE_PARALLEL_JOB_COUNT", "5"}});
  EXPECT_EQ(s.count, 5);
  expect_error("auto", {{"JOB_COMPLETION_INDEX", "1"}}, "say --shard auto/N");
  expect_error("auto", {}, "no shard index in the environment");
  expect_error("auto/8", {{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"}},
               "the environment says 4 shards, not 8");
  expect_error("auto/2", {{"JOB_COMPLETION_INDEX", "2"}}, "index 2 is outside 0..1");
  expect_error("auto", {{"SLURM_ARRAY_TASK_ID", "one"}}, "SLURM_ARRAY_TASK_ID: 'one'");
}

TEST(Shard, SplitIsDeterministicAndBalanced) {
  std::vector<PlanItem> items;
  for (int i = 0; i < 9; ++i) items.push_back({"case:" + std::to_string(i), double(1 + i % 3)});
  const auto a = touchstone::assign_shards(items, 3);
  EXPECT_EQ(a, touchstone::assign_shards(items, 3));
  std::vector<double> load(3, 0.0);
  for (size_t i = 0; i < items.size(); ++i) load[size_t(a[i])] += items[i].cost;
  EXPECT_EQ(load, (std::vector<double>{6, 6, 6}));  // 3 + 2 + 1 each
}

TEST(Shard, DurationsRoundTripAndEstimate) {
  const auto path = std::filesystem::temp_directory_path() / "ts_shard_durations.json";
  std::filesystem::remove(path);
  EXPECT_TRUE(touchstone::read_durations(path.string()).empty());
  touchstone::update_durations(path.string(), {{"case:a", 2.0}});
  touchstone::update_durations(path.string(), {{"case:b", 4.0}});
  const auto d = touchstone::read_durations(path.string());
  EXPECT_EQ(d.size(), 2u);
  // An unrecorded item: its units times the recorded seconds per unit (median).
  std::vector<PlanItem> items{{"case:a", 0}, {"case:b", 0}, {"case:c", 0}};
  touchstone::apply_durations(items, {10, 20, 30}, d);
  EXPECT_DOUBLE_EQ(items[2].cost, 30 * 0.2);
  std::ofstream(path) << "{\"items\": {\"case:a\": \"slow\"}}";
  try {
    touchstone::read_durations(path.string());
    ADD_FAILURE() << "read a malformed durations file";
  } catch (const touchstone::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/items/case:a"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// The shards of the real manifest's quick plan own each item exactly once.
TEST(Shard, ParityRunShardsPartitionThePlan) {
  touchstone::ParityOptions o;
  o.manifest = TOUCHSTONE_RUN_MANIFEST;
  o.backend = "reference";
  const std::vector<PlanItem> plan = touchstone::ParityRun(o).plan_items();
  ASSERT_GE(plan.size(), 3u);
  std::multiset<std::string> owned;
  for (int i = 0; i < 3; ++i) {
    o.shard = {i, 3};
    touchstone::ParityRun run(o);
    ASSERT_TRUE(run.shard().has_value());
    EXPECT_EQ(run.shard()->plan_items.size(), plan.size());
    for (const std::string& item : run.shard()->items) owned.insert(item);
  }
  EXPECT_EQ(owned.size(), plan.size());
  for (const PlanItem& p : plan) EXPECT_EQ(owned.count(p.name), 1u) << p.name;
  o.shard = {0, int(plan.size()) + 1};
  EXPECT_THROW(touchstone::ParityRun run(o), touchstone::Error);
}

}  // namespace
