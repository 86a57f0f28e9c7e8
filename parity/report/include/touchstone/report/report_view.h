// touchstone/report/report_view.h - a parity JSON report read back (by `touchstone
// parity --html/--summary` from its own report, by `touchstone summary` from
// several), as the HTML and Markdown writers need it.
//
// Reports of schema_version 1-2 and older ones (no schema_version, no series)
// are read; a field of the wrong type is an Error naming the source and the
// JSON pointer ("r.json: /cases/2/series/kl/5: expected a number or null").
#pragma once

#include <string>
#include <vector>

namespace touchstone {

// One case, consistency check or scoring passage of a run.
struct ItemView {
  std::string name;
  // "greedy", "consistency", "identity", "scoring", or "not_supported" (a planned
  // check the backend cannot support: failures[0] is the reason; never passed).
  std::string kind;
  bool passed = false;
  bool known = false;  // a reviewed known divergence (not passed, not counted as failed)
  std::vector<std::string> failures;
  int first_failing = -1;  // step (cases) or position (passages); -1 = none
  std::string
      divergence;  // first differing argmax: "reference 12 \"a\", backend 9 \"b\"", "" = none
  int divergence_step = -1;                  // its step
  int compared = 0, total = 0, matched = 0;  // steps / positions
  double nmse = 0, max_abs = 0, kld_mean = 0;
  // Per-step / per-position series (NaN where the report has null); empty when
  // the report has none.
  std::vector<double> kl, margin;
  std::vector<bool> top1_match;
  // Serving checks: one configuration each (batch size, fork point, draft length).
  struct Drift {
    std::string label;
    int size = 0, rows = 0;
    double nmse = 0, max_abs = 0;
    bool bitwise = true;
  };
  std::vector<Drift> drift;
};

struct RunView {
  std::string source;  // the report's path ("" for the run itself)
  // PASS, KNOWN_DIVERGENCE, FAIL, SKIP, UNSUPPORTED, INCOMPLETE; MISSING / INVALID (unread)
  std::string verdict;
  std::string reason;  // SKIP / UNSUPPORTED reason, or why the report could not be read
  std::string backend, backend_version, device, model, model_sha256, weights, profile, suite;
  std::string revision, started_at;
  std::string batching, fork;   // serving checks: how batches / forks ran ("" = not run)
  double near_tie_margin = -1;  // the profile's; -1 = unknown
  double seconds = 0;
  int checks_planned = 0;
  std::vector<ItemView> items;
};

// Parses a report's text; throws Error naming `source` and the field.
RunView parse_report_view(const std::string& json_text, const std::string& source);

// Reads the report at `path`; never throws: a missing file is verdict MISSING,
// an unreadable or malformed one INVALID, with the reason.
RunView read_report_view(const std::string& path);

// The overall verdict of several runs: FAIL when any is FAIL, INCOMPLETE,
// MISSING or INVALID (or there are none), else KNOWN_DIVERGENCE when any is,
// else PASS when any is PASS, else UNSUPPORTED / SKIP.
std::string overall_verdict(const std::vector<RunView>& runs);

// "18 runs: 10 PASS, 6 UNSUPPORTED, 2 SKIP": the count of each verdict present,
// in the order PASS, KNOWN_DIVERGENCE, FAIL, INCOMPLETE, MISSING, INVALID,
// UNSUPPORTED, SKIP (a headline that does not count a refusal as a pass).
std::string verdict_counts(const std::vector<RunView>& runs);

}  // namespace touchstone
