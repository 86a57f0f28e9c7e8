// shard.cpp - shard specs from flags and fleet environments, the
// deterministic split of a plan's items, and the recorded durations file.
#include "touchstone/run/shard.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>

#include "touchstone/common/error.h"
#include "touchstone/report/report.h"

namespace touchstone {
namespace {

constexpr int kMaxShards = 4096;

// A whole non-negative decimal number, else Error naming `what`.
int parse_count(const std::string& s, const std::string& what) {
  int v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0 || s.empty())
    throw Error("{}: '{}' is not a non-negative whole number", what, s);
  return v;
}

const std::string* get(const Environment& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// The index and count a fleet scheduler gave this process; count 0 when the
// scheduler does not say.
ShardSpec from_environment(const Environment& env) {
  if (const std::string* id = get(env, "SLURM_ARRAY_TASK_ID")) {
    const int min = get(env, "SLURM_ARRAY_TASK_MIN")
                        ? parse_count(*get(env, "SLURM_ARRAY_TASK_MIN"), "SLURM_ARRAY_TASK_MIN")
                        : 0;
    const std::string* n = get(env, "SLURM_ARRAY_TASK_COUNT");
    return {parse_count(*id, "SLURM_ARRAY_TASK_ID") - min,
            n ? parse_count(*n, "SLURM_ARRAY_TASK_COUNT") : 0};
  }
  if (const std::string* id = get(env, "JOB_COMPLETION_INDEX"))
    return {parse_count(*id, "JOB_COMPLETION_INDEX"), 0};
  if (const std::string* id = get(env, "BUILDKITE_PARALLEL_JOB")) {
    const std::string* n = get(env, "BUILDKITE_PARALLEL_JOB_COUNT");
    return {parse_count(*id, "BUILDKITE_PARALLEL_JOB"),
            n ? parse_count(*n, "BUILDKITE_PARALLEL_JOB_COUNT") : 0};
  }
  throw Error(
      "--shard auto: no shard index in the environment (SLURM_ARRAY_TASK_ID, "
      "JOB_COMPLETION_INDEX or BUILDKITE_PARALLEL_JOB)");
}

}  // namespace

Environment process_environment() {
  Environment env;
  for (const char* name :
       {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT",
        "JOB_COMPLETION_INDEX", "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT"})
    if (const char* v = std::getenv(name)) env[name] = v;
  return env;
}

ShardSpec parse_shard(const std::string& text, const Environment& env) {
  if (text.empty()) return {};
  const size_t slash = text.find('/');
  const std::string head = text.substr(0, slash);
  const int count =
      slash == std::string::npos ? 0 : parse_count(text.substr(slash + 1), "--shard count");
  ShardSpec s;
  if (head == "auto") {
    s = from_environment(env);
    if (count > 0 && s.count > 0 && s.count != count)
      throw Error("--shard {}: the environment says {} shards, not {}", text, s.count, count);
    if (count > 0) s.count = count;
    if (s.count == 0)
      throw Error("--shard {}: the environment gives no shard count; say --shard auto/N", text);
  } else {
    if (slash == std::string::npos) throw Error("--shard '{}': expected I/N, auto or auto/N", text);
    s = {parse_count(head, "--shard index"), count};
  }
  if (s.count < 1 || s.count > kMaxShards)
    throw Error("--shard {}: the count must be 1..{}, not {}", text, kMaxShards, s.count);
  if (s.index >= s.count)
    throw Error("--shard {}: index {} is outside 0..{}", text, s.index, s.count - 1);
  return s;
}

std::vector<int> assign_shards(const std::vector<PlanItem>& items, int n) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return items[a].cost != items[b].cost ? items[a].cost > items[b].cost
                                          : items[a].name < items[b].name;
  });
  std::vector<double> load(size_t(std::max(n, 1)), 0.0);
  std::vector<int> shard(items.size(), 0);
  for (size_t i : order) {
    const size_t s = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    shard[i] = int(s);
    load[s] += items[i].cost;
  }
  return shard;
}

std::map<std::string, double> read_durations(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error("{}: not a durations file: {}", path, e.what());
  }
  if (!j.is_object() || !j.contains("items") || !j["items"].is_object())
    throw Error("{}: /items: expected an object of item -> seconds", path);
  std::map<std::string, double> out;
  for (const auto& [name, v] : j["items"].items()) {
    if (!v.is_number() || v.get<double>() < 0)
      throw Error("{}: /items/{}: expected seconds (a non-negative number)", path, name);
    out[name] = v.get<double>();
  }
  return out;
}

void update_durations(const std::string& path, const std::map<std::string, double>& seconds) {
  std::map<std::string, double> all = read_durations(path);
  for (const auto& [k, v] : seconds) all[k] = v;
  nlohmann::json j{{"touchstone_durations", 1}, {"items", all}};
  write_file_atomic(path, j.dump(2) + "\n");
}

void apply_durations(std::vector<PlanItem>& items, const std::vector<double>& units,
                     const std::map<std::string, double>& recorded) {
  std::vector<double> rate;  // recorded seconds per unit
  for (size_t i = 0; i < items.size(); ++i)
    if (const auto it = recorded.find(items[i].name); it != recorded.end() && units[i] > 0)
      rate.push_back(it->second / units[i]);
  double per_unit = 1e-3;
  if (!rate.empty()) {
    std::nth_element(rate.begin(), rate.begin() + long(rate.size() / 2), rate.end());
    per_unit = rate[rate.size() / 2];
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const auto it = recorded.find(items[i].name);
    items[i].cost = it != recorded.end() ? it->second : units[i] * per_unit;
  }
}

}  // namespace touchstone
