// touchstone summary REPORT.json... : one matrix of several parity runs
// (backend x model x weight path: verdict, checks, worst NMSE / max-abs / KLD, time).
// Reads the JSON reports `touchstone parity --json` writes; a missing or
// malformed report is a row saying so, never a crash. Exit 0 when every row is
// PASS, SKIP or UNSUPPORTED, 1 otherwise. --html / --summary write the same runs
// as one HTML page (matrix + plots) and as Markdown (docs/report-format.md).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_common.h"
#include "readable_reports.h"
#include "touchstone/error.h"

namespace touchstone::cli {
namespace {

struct Row {
  std::string backend, model, weights, suite, verdict, note;
  int checks = 0, passed = 0;
  double nmse = 0, max_abs = 0, kld = 0, seconds = 0;
};

double num(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

Row read_row(const std::string& path) {
  Row r;
  r.backend = path;
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    r.verdict = "MISSING";
    r.note = "no report: " + path;
    return r;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    r.verdict = "INVALID";
    r.note = "not a JSON report: " + path;
    return r;
  }
  r.backend = j.value("/backend/name"_json_pointer, std::string("?"));
  r.model = j.value("/model/name"_json_pointer, std::string("?"));
  r.weights = j.value("weight_path", std::string("?"));
  r.suite = j.value("suite", std::string("?"));
  r.verdict = j.value("verdict", std::string(j.value("passed", false) ? "PASS" : "FAIL"));
  r.note = j.value("reason", std::string());
  r.seconds = num(j, "seconds");
  for (const char* kind : {"cases", "scoring"}) {
    for (const auto& c : j.value(kind, nlohmann::json::array())) {
      ++r.checks;
      r.passed += c.value("passed", false) ? 1 : 0;
      r.nmse = std::max(r.nmse, num(c, kind[0] == 'c' ? "nmse_max" : "topk_nmse"));
      r.max_abs = std::max(r.max_abs, num(c, kind[0] == 'c' ? "max_abs" : "topk_max_abs"));
      r.kld = std::max(r.kld, c.contains("kld") ? num(c["kld"], "mean") : num(c, "kld_mean"));
    }
  }
  return r;
}

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
      Row r = read_row(path);
      runs.push_back(read_report_view(path));  // stricter: every field's type is checked
      if (runs.back().verdict == "INVALID" && r.verdict != "INVALID") {
        r.verdict = "INVALID";
        r.note = runs.back().reason;
      }
      const bool good = r.verdict == "PASS" || r.verdict == "KNOWN_DIVERGENCE" ||
                        r.verdict == "SKIP" || r.verdict == "UNSUPPORTED";
      ok = ok && good;
      fmt::print(
          "{:<14} {:<28} {:<15} {:<7} {:<12} {:>3}/{:<3} {:>10.2e} {:>10.2e} {:>10.2e} {:>7.0f}s\n",
          r.backend, r.model, r.weights, r.suite, r.verdict, r.passed, r.checks, r.nmse, r.max_abs,
          r.kld, r.seconds);
      if (!r.note.empty()) fmt::print("  {}\n", r.note.substr(0, 300));
    }
    if (readable->any()) write_readable_reports(*readable, runs);
    exit_code = ok ? 0 : kExitFail;
  });
}

}  // namespace touchstone::cli
