// touchstone/runtime/stop_signals.h - nothing outlives a stopped harness.
//
// SIGTERM, SIGINT and SIGHUP (unless this process ignores them) end every
// process the backends started before this process ends by the same signal
// (exit status 128 + signo in a shell): in the harness, each tracked backend
// process's cgroup, process group and descendants (touchstone/runtime/process_tree.h);
// in touchstone-backend-runner, its own cgroup and descendants. The runner
// gets SIGTERM when the harness dies (PR_SET_PDEATHSIG), SIGKILL included.
// The reports on disk are the ones written after the last finished check.
#pragma once

#include <sys/types.h>

#include "touchstone/runtime/process_tree.h"

namespace touchstone::proc {

// The harness: a live backend process and its cgroup, for the handlers (and
// for the sweep of another channel, which spares it). Returns a slot, or -1
// when the table is full. Async-signal-safe.
int track_child(pid_t pid, const Cgroup& cg) noexcept;
void untrack_child(int slot) noexcept;
// The tracked processes other than `except`, at most `cap` of them, in `out`.
int tracked_pids(pid_t except, pid_t* out, int cap) noexcept;

// The harness's handlers (installed once; idempotent).
void install_harness_stop_handlers();
// In a forked child before exec: the default dispositions again. Async-signal-safe.
void reset_stop_handlers() noexcept;

// touchstone-backend-runner: becomes a child subreaper, installs its handlers
// and asks for SIGTERM (instead of SIGKILL) when its parent dies.
void install_runner_stop_handlers();
// touchstone-backend-runner, at a normal exit: ends what the backend left.
void end_runner_descendants() noexcept;

}  // namespace touchstone::proc
