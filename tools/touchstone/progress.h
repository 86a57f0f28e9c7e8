// Progress of `touchstone parity` on stderr. Always: one line per finished
// check ("  [2/7] narrative  PASS (1.2 s), about 14 s left"). When stderr is a
// terminal, also a status line rewritten in place (\r) while a check runs:
// checks done/total, the current check and step, tokens/s and an ETA.
#pragma once

#include <chrono>
#include <string>

namespace touchstone::cli {

class Progress {
 public:
  // total_units: tokens the whole run processes (prompt tokens + steps, positions).
  Progress(size_t total_checks, double total_units, bool tty);
  // Clears a status line still shown (a run ended by SKIP / UNSUPPORTED mid-check).
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A check starts; `units` is its share of total_units.
  void start(const std::string& name, double units);
  // Within the running check: `done` of `total` steps / positions (tty only, at most 10/s).
  void step(int done, int total);
  // The check finished after `seconds`, having processed `units`.
  void done(bool passed, double seconds, double units);

  // Stderr is a terminal (the status line is shown).
  static bool stderr_is_tty();

 private:
  using Clock = std::chrono::steady_clock;
  void status_line(int done, int total);

  size_t total_, done_ = 0;
  double units_, units_done_ = 0, elapsed_ = 0;
  bool tty_, line_shown_ = false;
  std::string name_;
  double item_units_ = 0;
  Clock::time_point item_start_{}, last_draw_{};
};

}  // namespace touchstone::cli
