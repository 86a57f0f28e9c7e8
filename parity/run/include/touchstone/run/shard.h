// shard.h - a parity run's plan split over N machines (docs/fleet.md).
//
// The plan's items, in run order, are the unit of a shard:
//   "case:<name>"      one greedy case
//   "scoring:<name>"   one scoring passage
//   "consistency"      the golden-free consistency checks (one group)
//   "serving"          the serving checks (one group; run when the backend
//                      has a serving member or they were asked for)
//   "structured"       the structured-output checks (one group)
// assign_shards gives each item to one of N shards, longest first to the
// least loaded shard (ties: the lower index), so every machine that plans the
// same items with the same costs computes the same split.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace touchstone {

struct ShardSpec {
  int index = 0;
  int count = 0;  // 0 = not sharded
  bool sharded() const { return count > 0; }
};

// Where a shard index comes from when --shard says "auto" (name, value).
using Environment = std::map<std::string, std::string>;
Environment process_environment();  // the variables parse_shard reads, from getenv

// "I/N" (0 <= I < N <= 4096); "auto" or "auto/N": the index (and count) from
// the environment, first of
//   Slurm array job    SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN (min 0 when
//                      unset), count SLURM_ARRAY_TASK_COUNT
//   Kubernetes Indexed Job  JOB_COMPLETION_INDEX (its count only from "auto/N")
//   Buildkite parallelism   BUILDKITE_PARALLEL_JOB, BUILDKITE_PARALLEL_JOB_COUNT
// "auto/N" sets the count and checks the environment's against it. "" = not
// sharded. Throws touchstone::Error naming the value or variable at fault.
ShardSpec parse_shard(const std::string& text, const Environment& env);

struct PlanItem {
  std::string name;  // as above
  double cost = 0;   // seconds, recorded or estimated (durations_file)
};

// shard[i] for items[i]; n >= 1.
std::vector<int> assign_shards(const std::vector<PlanItem>& items, int n);

// Recorded durations (seconds per item) of a plan: a JSON file
//   {"touchstone_durations": 1, "items": {"case:narrative": 3.2, ...}}
// A missing file is an empty map; a malformed one throws Error naming the
// file and field.
std::map<std::string, double> read_durations(const std::string& path);
// Merges `seconds` into the file (atomic rewrite; other items kept).
void update_durations(const std::string& path, const std::map<std::string, double>& seconds);

// Each item's cost: its recorded duration, else its estimate (work units, e.g.
// tokens) times the median recorded seconds per unit (1 ms per unit when
// nothing comparable is recorded).
void apply_durations(std::vector<PlanItem>& items, const std::vector<double>& units,
                     const std::map<std::string, double>& recorded);

}  // namespace touchstone
