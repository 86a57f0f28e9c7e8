// touchstone summary REPORT.json... : one matrix of several parity runs
// (backend x model x weight path: verdict, checks, worst NMSE / max-abs / KLD, time).
// Reads the JSON reports `touchstone parity --json` writes; a missing or
// malformed report is a row saying so, never a crash. Exit 0 when every row is
// PASS, SKIP or UNSUPPORTED, 1 otherwise. --html / --summary write the same runs
// as one HTML page (matrix + plots) and as Markdown (docs/report-format.md).
#include <fmt/format.h>

#include <algorithm>

#include "cli_common.h"
#include "readable_reports.h"
#include "touchstone/common/error.h"

namespace touchstone::cli {
namespace {

// One row of the table: the worst figures over a run's checks.
struct Row {
  int checks = 0, passed = 0;
  double nmse = 0, max_abs = 0, kld = 0;
};

Row worst(const RunView& v) {
  Row r;
  for (const ItemView& c : v.items) {
    if (c.kind == "not_supported") continue;
    ++r.checks;
    r.passed += c.passed ? 1 : 0;
    r.nmse = std::max(r.nmse, c.nmse);
    r.max_abs = std::max(r.max_abs, c.max_abs);
    r.kld = std::max(r.kld, c.kld_mean);
  }
  return r;
}

std::string field(const std::string& s) { return s.empty() ? "?" : s; }

}  // namespace

void add_summary(CLI::App& app, int& exit_code) {
  auto files = std::make_shared<std::vector<std::string>>();
  auto readable = std::make_shared<ReadableOutputs>();
  CLI::App* cmd = app.add_subcommand(
      "summary", "One backend x model x weight-path matrix from several `parity --json` reports");
  cmd->add_option("reports", *files, "JSON reports")->required();
  add_readable_options(*cmd, *readable);
  cmd->footer(
      "Exit codes: 0 every report PASS, SKIP or UNSUPPORTED; 1 otherwise (FAIL, "
      "INCOMPLETE, missing or malformed); 2 error (e.g. an output file not writable).");
  cmd->callback([files, readable, &exit_code] {
    bool ok = true;
    fmt::print("\n{:<14} {:<28} {:<15} {:<7} {:<12} {:>7} {:>10} {:>10} {:>10} {:>8}\n", "backend",
               "model", "weights", "suite", "verdict", "checks", "NMSE max", "max|Δ|", "KLD mean",
               "time");
    std::vector<RunView> runs;
    for (const std::string& path : *files) {
      const RunView& v = runs.emplace_back(read_report_view(path));  // every field's type checked
      const Row r = worst(v);
      const bool good = v.verdict == "PASS" || v.verdict == "KNOWN_DIVERGENCE" ||
                        v.verdict == "SKIP" || v.verdict == "UNSUPPORTED";
      ok = ok && good;
      const bool read = v.verdict != "MISSING" && v.verdict != "INVALID";
      fmt::print(
          "{:<14} {:<28} {:<15} {:<7} {:<12} {:>3}/{:<3} {:>10.2e} {:>10.2e} {:>10.2e} {:>7.0f}s\n",
          read ? field(v.backend) : path, read ? field(v.model) : "", read ? field(v.weights) : "",
          read ? field(v.suite) : "", v.verdict, r.passed, r.checks, r.nmse, r.max_abs, r.kld,
          v.seconds);
      if (!v.reason.empty()) fmt::print("  {}\n", v.reason.substr(0, 300));
    }
    if (readable->any()) write_readable_reports(*readable, runs);
    exit_code = ok ? 0 : kExitFail;
  });
}

}  // namespace touchstone::cli
