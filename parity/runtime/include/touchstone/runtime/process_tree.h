// touchstone/runtime/process_tree.h - ending every process a backend started.
//
// Two mechanisms, used by the harness (channel_child.cpp) and by
// touchstone-backend-runner:
//   - cgroup v2, where the host allows it: each backend process starts in a
//     child cgroup of the harness's own; writing 1 to its cgroup.kill kills the
//     whole subtree at once, so a process that re-forks or leaves its process
//     group cannot escape;
//   - a sweep (always, after the cgroup where there is one): the process group
//     is killed, then /proc is scanned for descendants of this process (a child
//     subreaper, so orphans are handed to it) and each is killed with its
//     process group, scan after scan until two in a row find none.
// Every function marked async-signal-safe uses only system calls and static
// storage, so the stop-signal handlers (stop_signals.h) can call it.
#pragma once

#include <sys/types.h>

namespace touchstone::proc {

// SIGKILLs every descendant of this process except the subtrees of the
// `n_spare` processes in `spare` (live backend processes of other channels),
// with each one's process group unless it is this process's or a spared one's;
// reaps the killed processes that are this process's children. Scans until two
// consecutive scans find none or `budget_ms` has passed. Returns how many
// processes were killed. Async-signal-safe.
int kill_descendants(const pid_t* spare, int n_spare, int budget_ms) noexcept;

// A cgroup v2 directory made for one backend process, with its control files
// open, so that entering and killing it need no allocation.
struct Cgroup {
  char dir[512] = {};
  int procs_fd = -1;  // dir/cgroup.procs
  int kill_fd = -1;   // dir/cgroup.kill
  bool active() const { return kill_fd >= 0; }
};

// Whether backend processes get a cgroup here: this process's cgroup v2
// directory is writable and a child of it has cgroup.kill (probed once, by
// creating and removing one). TOUCHSTONE_NO_CGROUP=1 says no.
bool cgroups_usable();
// "cgroup v2" or "process-group sweep": what cgroups_usable() chose.
const char* cleanup_mechanism();

// A new, empty child cgroup of this process's own (touchstone-PID-N); inactive
// where cgroups are not usable or the directory cannot be made.
Cgroup cgroup_create();
// Moves `pid` into the cgroup. Async-signal-safe.
bool cgroup_enter(const Cgroup& cg, pid_t pid) noexcept;
// Kills every process in the cgroup. Async-signal-safe.
void cgroup_kill(const Cgroup& cg) noexcept;
// Kills the cgroup's processes, waits (at most `budget_ms`) until it is empty,
// removes the directory and closes its files. Async-signal-safe.
void cgroup_remove(Cgroup& cg, int budget_ms) noexcept;

// touchstone-backend-runner: the cgroup the harness made for this process (its
// own, when that is a touchstone-* directory), else inactive.
Cgroup cgroup_own();
// Moves this process to the parent of `cg`, so that it can kill and remove the
// cgroup and outlive it. Async-signal-safe.
bool cgroup_leave(const Cgroup& cg) noexcept;

}  // namespace touchstone::proc
