// parity_observer.h - `touchstone parity`'s ParityObserver: the progress
// line on stderr and the report files rewritten after every row.
#pragma once

#include <memory>
#include <string>

#include "progress.h"
#include "readable_reports.h"
#include "touchstone/run/parity_run.h"

namespace touchstone::cli {

// Where the report goes (--json, --junit, --html, --summary); empty: nowhere.
struct ReportOutputs {
  std::string json, junit;
  ReadableOutputs readable;
};

// Progress on stderr, and the reports as they stand rewritten atomically
// after every row (HTML and Markdown rendered from the JSON, as `touchstone
// summary` does). The first report_updated, before any backend call, fails
// on an output path that cannot be written.
class CliObserver : public ParityObserver {
 public:
  explicit CliObserver(const ReportOutputs& o) : o_(o) {}
  void planned(size_t n_checks, double units) override;
  void check_started(const std::string& name, double units) override;
  void check_progress(int done, int total) override;
  void check_finished(bool acceptable, double seconds, double units) override;
  void note(const std::string& line) override;
  void report_updated(const Report& r) override;

 private:
  const ReportOutputs& o_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace touchstone::cli
