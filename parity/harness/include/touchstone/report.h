// touchstone/report.h - the parity report: console table, JSON and JUnit XML.
#pragma once

#include <string>
#include <vector>

#include "touchstone/parity.h"

namespace touchstone {

struct RunInfo {
  std::string backend, backend_path, device, weight_path, profile, suite, model_name, model_sha256;
  int n_threads = 0;
};

struct Report {
  RunInfo info;
  std::vector<CaseResult> cases;
  std::vector<ScoringResult> scoring;
  bool passed() const;
};

// Human-readable table (backend x case: verdict, tokens matched, first divergence, NMSE, KLD)
// followed by one line per failure reason.
std::string format_table(const Report& r);
std::string to_json(const Report& r);   // machine-readable, every number in the table and more
std::string to_junit(const Report& r);  // one <testcase> per case / scoring passage

// Writes `content` to `path` atomically (temp file in the same directory + rename).
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace touchstone
