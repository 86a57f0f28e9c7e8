// parity_shard.cpp - a parity run's plan as items, and one shard of it: the
// items split by recorded (or estimated) duration, the run narrowed to this
// shard's, and the digests `touchstone merge` checks the shards against.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "parity_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"

namespace touchstone::run_detail {
namespace {

// Estimated work of the golden-free groups, in the units of case_units
// (tokens): each re-runs its anchor sequence several times.
double group_units(const Opts& o, const Inputs& in, const std::string& item) {
  const double tokens = consistency_tokens(o, in.manifest.find_suite(o.suite));
  if (item == "consistency") return 12 * tokens;
  if (item == "serving") return 24 * tokens;
  return 8 * tokens;  // structured
}

std::string file_digest(const std::string& path) {
  return sha256_hex(fileio::read_file(path, "known-divergence file"));
}

// What decides the results of the plan's items, as one digest.
std::string plan_digest(const Opts& o, const Inputs& in, const std::vector<PlanItem>& items) {
  nlohmann::json j{{"backend", o.backend},
                   {"weights", o.weights},
                   {"profile", in.profile->name},
                   {"suite", o.suite},
                   {"model", in.plan.model->name},
                   {"max_steps", o.max_steps},
                   {"max_positions", o.max_positions},
                   {"consistency_tokens", o.consistency_tokens},
                   {"threads", o.threads},
                   {"fault", o.fault},
                   {"serving_plan", o.serving_plan},
                   {"serving_checks", o.serving_checks},
                   {"structured_checks", o.structured_checks},
                   {"context", in.context}};
  // The costs decide the split: shards balanced by other durations would
  // claim other items.
  for (const PlanItem& it : items) j["items"].push_back({it.name, it.cost});
  for (const std::string& k : o.known_divergences) j["known_divergences"].push_back(file_digest(k));
  return sha256_hex(j.dump());
}

std::string host_name() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string();
}

}  // namespace

double case_units(const Opts& o, const Inputs& in, const std::string& n) {
  const int max_steps = effective_max_steps(o, in.manifest.find_suite(o.suite));
  const GoldenCase& g = *in.golden.find_case(n);
  const double steps = double(g.greedy_ids.size());
  return double(g.prompt_ids.size()) + (max_steps > 0 ? std::min(steps, double(max_steps)) : steps);
}

double scoring_units(const Opts& o, const Inputs& in, const std::string& n) {
  const double pos = double(in.golden.find_scoring(n)->token_ids.size());
  const int max_positions = effective_max_positions(o, in.manifest.find_suite(o.suite), n);
  return max_positions > 0 ? std::min(pos, double(max_positions)) : pos;
}

const std::string& anchor_case(const Inputs& in) {
  return in.plan.all_cases.empty() ? in.golden.cases.front().name : in.plan.all_cases.front();
}

std::vector<PlanItem> plan_items(const Opts& o, const Inputs& in) {
  std::vector<PlanItem> items;
  std::vector<double> units;
  const bool checks = !o.consistency_only && !o.serving_only && !o.structured_only;
  for (const std::string& n : checks ? in.plan.all_cases : std::vector<std::string>{}) {
    items.push_back({"case:" + n, 0});
    units.push_back(case_units(o, in, n));
  }
  for (const std::string& n : checks ? in.plan.all_scoring : std::vector<std::string>{}) {
    items.push_back({"scoring:" + n, 0});
    units.push_back(scoring_units(o, in, n));
  }
  // The groups a run may start (serving: decided against the backend when it runs).
  const bool named = !o.cases.empty() || !o.scoring.empty();
  const bool serving = !o.no_serving && !o.consistency_only && !o.structured_only &&
                       (o.serving || o.serving_only || !named);
  for (const auto& [group, on] : {std::pair<const char*, bool>{"consistency", wants_consistency(o)},
                                  {"serving", serving},
                                  {"structured", wants_structured(o)}}) {
    if (!on) continue;
    items.push_back({group, 0});
    units.push_back(group_units(o, in, group));
  }
  apply_durations(
      items, units,
      o.durations.empty() ? std::map<std::string, double>{} : read_durations(o.durations));
  return items;
}

void apply_shard(Opts& o, Inputs& in) {
  if (!o.shard.sharded()) return;
  const std::vector<PlanItem> items = plan_items(o, in);
  if (int(items.size()) < o.shard.count) {
    throw Error(
        "--shard {}/{}: the plan has {} items (cases, passages, check groups), fewer than "
        "{} shards",
        o.shard.index, o.shard.count, items.size(), o.shard.count);
  }
  const std::vector<int> shard = assign_shards(items, o.shard.count);
  ShardInfo info{o.shard.index,
                 o.shard.count,
                 plan_digest(o, in, items),
                 in.plan.model->golden_sha256.empty() ? "unpinned" : in.plan.model->golden_sha256,
                 {},
                 {},
                 host_name()};
  for (size_t i = 0; i < items.size(); ++i) {
    info.plan_items.push_back(items[i].name);
    if (shard[i] == o.shard.index) info.items.push_back(items[i].name);
  }
  auto mine = [&](const std::string& item) { return std::ranges::count(info.items, item) > 0; };
  std::erase_if(in.plan.cases, [&](const std::string& n) { return !mine("case:" + n); });
  std::erase_if(in.plan.scoring, [&](const std::string& n) { return !mine("scoring:" + n); });
  if (!mine("consistency")) o.no_consistency = true;
  if (!mine("serving")) o.no_serving = true;
  if (!mine("structured")) {
    o.structured = o.structured_only = false;
    o.structured_checks.clear();
  }
  in.own_identity = !items.empty() && mine(items.front().name);
  in.shard = std::move(info);
}

}  // namespace touchstone::run_detail
