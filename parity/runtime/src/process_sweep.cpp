// The descendant sweep of touchstone/runtime/process_tree.h: /proc scanned with raw
// system calls into a static table, so that a signal handler may run it.
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "touchstone/runtime/process_tree.h"

namespace touchstone::proc {
namespace {

struct Entry {
  pid_t pid, ppid, pgrp;
  char state;
  char mark;  // 0 not known to be ours, 1 a descendant to kill, 2 in a spared subtree
};

constexpr int kMaxEntries = 32768;
Entry g_table[kMaxEntries];

struct LinuxDirent64 {
  unsigned long long d_ino;
  long long d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

long now_ms() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return long(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(long ms) noexcept {
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  ::nanosleep(&ts, nullptr);
}

// "/proc/PID/stat" into `e`: state, ppid and pgrp follow the last ')'.
bool read_stat(pid_t pid, Entry& e) noexcept {
  char path[32] = "/proc/";
  char digits[16];
  int n = 0;
  for (pid_t v = pid; v > 0 && n < 15; v /= 10) digits[n++] = char('0' + v % 10);
  int len = 6;
  while (n > 0) path[len++] = digits[--n];
  for (const char* s = "/stat"; *s; ++s) path[len++] = *s;
  path[len] = 0;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (got <= 0) return false;
  buf[got] = 0;
  const char* p = nullptr;
  for (const char* q = buf; *q; ++q)
    if (*q == ')') p = q;
  if (!p || !p[1] || !p[2]) return false;
  e.state = p[2];
  p += 3;
  long fields[2] = {0, 0};
  for (long& f : fields) {
    while (*p == ' ') ++p;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') f = f * 10 + (*p++ - '0');
  }
  e.pid = pid;
  e.ppid = pid_t(fields[0]);
  e.pgrp = pid_t(fields[1]);
  e.mark = 0;
  return true;
}

// Every process of /proc into g_table; returns how many.
int scan() noexcept {
  const int dfd = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return 0;
  int n = 0;
  alignas(8) char buf[8192];
  for (;;) {
    const long got = ::syscall(SYS_getdents64, dfd, buf, sizeof buf);
    if (got <= 0) break;
    for (long off = 0; off < got && n < kMaxEntries;) {
      const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
      off += d->d_reclen;
      long pid = 0;
      const char* c = d->d_name;
      for (; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
      if (*c != 0 || pid <= 0) continue;
      if (read_stat(pid_t(pid), g_table[n])) ++n;
    }
  }
  ::close(dfd);
  return n;
}

bool is_spare(pid_t pid, const pid_t* spare, int n_spare) noexcept {
  for (int i = 0; i < n_spare; ++i)
    if (spare[i] == pid) return true;
  return false;
}

// Marks this process's descendants: 1 to kill, 2 in a spared subtree.
void mark(int n, const pid_t* spare, int n_spare) noexcept {
  const pid_t self = ::getpid();
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < n; ++i) {
      Entry& e = g_table[i];
      if (e.mark != 0 || e.pid == self) continue;
      char parent = 0;
      if (e.ppid == self) {
        parent = is_spare(e.pid, spare, n_spare) ? 2 : 1;
      } else {
        for (int j = 0; j < n && parent == 0; ++j)
          if (g_table[j].pid == e.ppid) parent = g_table[j].mark;
      }
      if (parent != 0) {
        e.mark = parent;
        changed = true;
      }
    }
  }
}

// One scan: kills the live descendants found, reaps this process's zombies.
int sweep_once(const pid_t* spare, int n_spare) noexcept {
  const int n = scan();
  mark(n, spare, n_spare);
  const pid_t self = ::getpid(), own_group = ::getpgrp();
  int killed = 0;
  for (int i = 0; i < n; ++i) {
    const Entry& e = g_table[i];
    if (e.mark != 1) continue;
    if (e.state != 'Z' && e.state != 'X') {
      ::kill(e.pid, SIGKILL);
      ++killed;
      // Its group too, where a descendant leads it: a re-forking process's
      // newest child is in it.
      bool ours = false;
      for (int j = 0; j < n && !ours; ++j) ours = g_table[j].pid == e.pgrp && g_table[j].mark == 1;
      if (ours && e.pgrp != own_group && !is_spare(e.pgrp, spare, n_spare))
        ::kill(-e.pgrp, SIGKILL);
    }
    int status = 0;
    if (e.ppid == self) ::waitpid(e.pid, &status, WNOHANG);
  }
  return killed;
}

}  // namespace

int kill_descendants(const pid_t* spare, int n_spare, int budget_ms) noexcept {
  const long deadline = now_ms() + budget_ms;
  int total = 0, empty_in_row = 0;
  while (empty_in_row < 2 && now_ms() < deadline) {
    const int killed = sweep_once(spare, n_spare);
    total += killed;
    empty_in_row = killed == 0 ? empty_in_row + 1 : 0;
    if (empty_in_row < 2) sleep_ms(killed == 0 ? 10 : 2);
  }
  return total;
}

}  // namespace touchstone::proc
