#include "parity_observer.h"

#include <fmt/format.h>

#include <cstdio>

#include "touchstone/report/report.h"
#include "touchstone/report/report_view.h"

namespace touchstone::cli {

void CliObserver::planned(size_t n_checks, double units) {
  progress_ = std::make_unique<Progress>(n_checks, units, Progress::stderr_is_tty());
}

void CliObserver::check_started(const std::string& name, double units) {
  if (progress_) progress_->start(name, units);
}

void CliObserver::check_progress(int done, int total) {
  if (progress_) progress_->step(done, total);
}

void CliObserver::check_finished(bool acceptable, double seconds, double units) {
  if (progress_) progress_->done(acceptable, seconds, units);
}

void CliObserver::note(const std::string& line) {
  progress_.reset();
  fmt::print(stderr, "  {}\n", line);
}

void CliObserver::report_updated(const Report& r) {
  if (r.complete) progress_.reset();
  if (o_.json.empty() && !o_.readable.any() && o_.junit.empty()) return;
  const std::string json = to_json(r);
  if (!o_.json.empty()) write_file_atomic(o_.json, json);
  if (!o_.junit.empty()) write_file_atomic(o_.junit, to_junit(r));
  if (o_.readable.any())
    write_readable_reports(o_.readable, {parse_report_view(json, o_.json.empty() ? "" : o_.json)});
}

}  // namespace touchstone::cli
