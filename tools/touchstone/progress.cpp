#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace touchstone::cli {

Progress::Progress(size_t total_checks, double total_units, bool tty)
    : total_(total_checks), units_(total_units), tty_(tty) {}

Progress::~Progress() {
  if (line_shown_) fmt::print(stderr, "\r\x1b[K");
}

bool Progress::stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

void Progress::start(const std::string& name, double units) {
  name_ = name;
  item_units_ = units;
  item_start_ = Clock::now();
  last_draw_ = {};
  if (tty_) {
    status_line(0, 0);
    return;
  }
  fmt::print(stderr, "  [{}/{}] {:<22} ", done_ + 1, total_, name);
  std::fflush(stderr);
}

void Progress::step(int done, int total) {
  if (!tty_) return;
  const auto now = Clock::now();
  if (done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  status_line(done, total);
}

// "\r\x1b[K  [2/7] narrative  step 12/64  35.2 tok/s  ETA 14 s"
void Progress::status_line(int done, int total) {
  const double item_s = std::chrono::duration<double>(Clock::now() - item_start_).count();
  const double item_done = total > 0 ? item_units_ * double(done) / double(total) : 0.0;
  const double secs = elapsed_ + item_s, units = units_done_ + item_done;
  const double rate = secs > 0 && units > 0 ? units / secs : 0.0;
  std::string line = fmt::format("  [{}/{}] {:.32}", done_ + 1, total_, name_);
  if (total > 0) line += fmt::format("  {}/{}", done, total);
  line += rate > 0 ? fmt::format("  {:.1f} tok/s  ETA {:.0f} s", rate, (units_ - units) / rate)
                   : std::string("  …");
  fmt::print(stderr, "\r\x1b[K{}", line);
  std::fflush(stderr);
  line_shown_ = true;
}

void Progress::done(bool passed, double seconds, double units) {
  ++done_;
  units_done_ += units;
  elapsed_ += seconds;
  const double left = units_done_ > 0 ? elapsed_ / units_done_ * (units_ - units_done_) : 0.0;
  if (tty_) fmt::print(stderr, "\r\x1b[K  [{}/{}] {:<22} ", done_, total_, name_);
  line_shown_ = false;
  fmt::print(stderr, "{} ({:.1f} s){}\n", passed ? "PASS" : "FAIL", seconds,
             done_ < total_ ? fmt::format(", about {:.0f} s left", left) : "");
}

}  // namespace touchstone::cli
