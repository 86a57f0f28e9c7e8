// touchstone/report.h - the parity report: console table, JSON and JUnit XML.
#pragma once

#include <string>
#include <vector>

#include "touchstone/parity.h"

namespace touchstone {

struct RunInfo {
  std::string backend, backend_path, device, weight_path, profile, suite, model_name, model_sha256;
  int n_threads = 0;
  // "child process (time limit 300 s per call)" or "in process".
  std::string execution;
};

struct Report {
  RunInfo info;
  std::vector<CaseResult> cases;
  std::vector<ScoringResult> scoring;
  // False while the run is going on (reports are rewritten after every case):
  // a report left by a killed run says so.
  bool complete = false;
  int n_planned = 0;  // cases + passages the run set out to check
  // Set when the run could not check anything: the backend has no device here
  // (TS_ERR_DEVICE) or refuses this model / weight path (TS_ERR_UNSUPPORTED).
  std::string skipped, unsupported;
  double seconds = 0.0;  // wall time of the whole run
  // PASS only for a complete run with at least one result, every one PASS.
  bool passed() const;
  // "PASS", "FAIL", "SKIP", "UNSUPPORTED" or "INCOMPLETE".
  std::string verdict() const;
};

// Human-readable table (backend x case: verdict, tokens matched, first divergence, NMSE, KLD)
// followed by one line per failure reason.
std::string format_table(const Report& r);
std::string to_json(const Report& r);   // machine-readable, every number in the table and more
std::string to_junit(const Report& r);  // one <testcase> per case / scoring passage

// Writes `content` to `path` atomically: a temp file ".<name>.tmp-<pid>" in
// the same directory, written, fsynced, closed, renamed over `path`. Errors
// name the file and carry strerror(errno); `path` is never half-written.
void write_file_atomic(const std::string& path, const std::string& content);

// XML 1.0 attribute/text escaping of sanitize_utf8(s) (touchstone/tokenizer.h:
// invalid UTF-8 -> U+FFFD): & < > " escaped, the
// characters XML 1.0 forbids (C0 controls but tab/LF/CR, U+FFFE, U+FFFF)
// written as the text "\xNN" / "\u{FFFE}".
std::string xml_escape(const std::string& s);

}  // namespace touchstone
