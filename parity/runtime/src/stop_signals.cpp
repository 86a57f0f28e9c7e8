// The stop-signal handlers of touchstone/runtime/stop_signals.h. They run on whatever
// thread the signal interrupts, so they use only async-signal-safe calls and
// the fixed table below.
#include "touchstone/runtime/stop_signals.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>

namespace touchstone::proc {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
constexpr int kSlots = 64;

struct Slot {
  std::atomic<bool> used{false};
  pid_t pid = -1;
  Cgroup cgroup;
};
Slot g_slots[kSlots];
Cgroup g_runner_cgroup;   // the runner's own, when the harness made one
pid_t g_runner_pid = -1;  // a process the backend forks inherits the handler

[[noreturn]] void reraise(int sig) noexcept {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  ::sigaction(sig, &sa, nullptr);
  sigset_t set;
  ::sigemptyset(&set);
  ::sigaddset(&set, sig);
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
  ::_exit(128 + sig);
}

void harness_stop(int sig) {
  for (Slot& s : g_slots) {
    if (!s.used.load()) continue;
    cgroup_kill(s.cgroup);
    ::kill(-s.pid, SIGKILL);
    ::kill(s.pid, SIGKILL);
  }
  kill_descendants(nullptr, 0, 3000);
  for (Slot& s : g_slots) {
    if (!s.used.load()) continue;
    Cgroup cg = s.cgroup;
    cgroup_remove(cg, 1000);
  }
  reraise(sig);
}

void runner_stop(int sig) {
  if (::getpid() == g_runner_pid) end_runner_descendants();
  reraise(sig);
}

// `handler` for each stop signal this process does not ignore.
void install(void (*handler)(int)) {
  for (const int sig : kStopSignals) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = handler;
    ::sigemptyset(&sa.sa_mask);
    for (const int other : kStopSignals) ::sigaddset(&sa.sa_mask, other);
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int track_child(pid_t pid, const Cgroup& cg) noexcept {
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    if (s.used.load()) continue;
    s.pid = pid;
    s.cgroup = cg;
    s.used.store(true);
    return i;
  }
  return -1;
}

void untrack_child(int slot) noexcept {
  if (slot >= 0 && slot < kSlots) g_slots[slot].used.store(false);
}

int tracked_pids(pid_t except, pid_t* out, int cap) noexcept {
  int n = 0;
  for (const Slot& s : g_slots)
    if (s.used.load() && s.pid != except && n < cap) out[n++] = s.pid;
  return n;
}

void install_harness_stop_handlers() {
  static const bool once = (install(harness_stop), true);
  (void)once;
}

void reset_stop_handlers() noexcept {
  for (const int sig : kStopSignals) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler != harness_stop) continue;
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    ::sigaction(sig, &sa, nullptr);
  }
}

void install_runner_stop_handlers() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  g_runner_pid = ::getpid();
  g_runner_cgroup = cgroup_own();
  install(runner_stop);
  // Armed with SIGKILL by the harness before exec; SIGTERM lets the handler
  // end the backend's processes first. The parent is still the one that
  // armed it: the setting has been on without a gap since before exec.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
}

void end_runner_descendants() noexcept {
  if (::getpid() != g_runner_pid) return;
  if (g_runner_cgroup.active() && cgroup_leave(g_runner_cgroup))
    cgroup_remove(g_runner_cgroup, 1000);
  kill_descendants(nullptr, 0, 3000);
}

}  // namespace touchstone::proc
