// touchstone merge SHARD.json... : the JSON reports of a plan's shards
// (`touchstone parity --shard I/N --json F`) put back together into the report
// an unsharded run writes (touchstone/report/report_merge.h, docs/fleet.md).
// Prints each shard and the merged items; --json / --html / --summary write
// the merged report; --durations records each item's seconds for the next
// split. Exit 0 PASS or KNOWN_DIVERGENCE, 1 FAIL or INCOMPLETE (a shard
// missing or unfinished), 2 input that cannot be merged, 77 / 3 SKIP /
// UNSUPPORTED.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "readable_reports.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/report/report.h"
#include "touchstone/report/report_merge.h"
#include "touchstone/report/report_render.h"
#include "touchstone/run/shard.h"

namespace touchstone::cli {
namespace {

struct MergeOpts {
  std::vector<std::string> files;
  std::string json, durations;
  ReadableOutputs readable;
};

// Seconds per plan item (the items' names as in shard.h) from the merged rows.
std::map<std::string, double> item_seconds(const nlohmann::json& m) {
  std::map<std::string, double> out;
  for (const auto& row : m["scoring"])
    out["scoring:" + row.value("name", "")] = row.value("seconds", 0.0);
  for (const auto& row : m["cases"])
    if (const std::string item = plan_item_of(row.value("name", ""), false); !item.empty())
      out[item] += row.value("seconds", 0.0);
  return out;
}

int run_merge(const MergeOpts& o) {
  std::vector<std::pair<std::string, std::string>> sources;
  for (const std::string& f : o.files)
    sources.emplace_back(f, fileio::read_file(f, "shard report"));
  const MergedReport m = merge_shard_reports(sources);
  const nlohmann::json j = nlohmann::json::parse(m.json);
  for (const auto& s : j["shards"]) {
    fmt::print("shard {} ({}, {}): {} items, {}, {:.1f} s\n", s["index"].get<int>(),
               s.value("source", ""), s.value("host", ""), s["items"].size(),
               s.value("verdict", ""), s.value("seconds", 0.0));
  }
  const RunView view = parse_report_view(m.json, o.json.empty() ? "merged" : o.json);
  for (const ItemView& item : view.items)
    fmt::print("  {:<32} {}\n", terminal_text(item.name), item_cell(item));
  for (const std::string& why : m.missing) fmt::print("missing: {}\n", why);
  fmt::print("\nverdict: {}\n", m.verdict);
  if (!o.json.empty()) write_file_atomic(o.json, m.json);
  if (o.readable.any()) write_readable_reports(o.readable, {view});
  if (!o.durations.empty()) update_durations(o.durations, item_seconds(j));
  if (m.verdict == "SKIP") return kExitSkip;
  if (m.verdict == "UNSUPPORTED") return kExitUnsupported;
  return m.verdict == "PASS" || m.verdict == "KNOWN_DIVERGENCE" ? 0 : kExitFail;
}

}  // namespace

void add_merge(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<MergeOpts>();
  CLI::App* cmd = app.add_subcommand(
      "merge", "One report from the JSON reports of a plan's shards (`parity --shard I/N --json`)");
  cmd->add_option("reports", o->files, "The shards' JSON reports")->required();
  cmd->add_option("--json", o->json, "Write the merged report as JSON here");
  cmd->add_option("--durations", o->durations,
                  "Record each item's seconds in this durations file (balances the next split)");
  add_readable_options(*cmd, o->readable);
  cmd->footer(
      "Exit codes: 0 PASS or KNOWN_DIVERGENCE; 1 FAIL, or INCOMPLETE (a shard missing or "
      "unfinished); 2 reports that cannot be merged (another plan or goldens, a shard twice, "
      "an item claimed twice, a damaged file); 77 SKIP; 3 UNSUPPORTED.");
  cmd->callback([o, &exit_code] { exit_code = run_merge(*o); });
}

}  // namespace touchstone::cli
