// The cgroup v2 half of touchstone/runtime/process_tree.h: a child cgroup per backend
// process, killed as a whole through cgroup.kill and then removed.
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "touchstone/runtime/process_tree.h"

namespace touchstone::proc {
namespace {

// This process's cgroup v2 directory: the "0::PATH" line of /proc/self/cgroup
// under the cgroup2 mount of /proc/self/mountinfo; "" where there is none.
std::string own_cgroup_dir() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line))
    if (line.starts_with("0::")) path = line.substr(3);
  if (path.empty()) return "";
  std::ifstream mi("/proc/self/mountinfo");
  while (std::getline(mi, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos || !line.substr(dash + 3).starts_with("cgroup2 ")) continue;
    std::istringstream f(line);
    std::string id, parent, dev, root, mount;
    if (!(f >> id >> parent >> dev >> root >> mount)) continue;
    if (root == "/") return path == "/" ? mount : mount + path;
    if (path.starts_with(root)) return mount + path.substr(root.size());
  }
  return "";
}

// `a` + `b` into `out` (of size `cap`); false when it does not fit.
bool join(char* out, size_t cap, const char* a, const char* b) noexcept {
  const size_t na = std::strlen(a), nb = std::strlen(b);
  if (na + nb + 1 > cap) return false;
  std::memcpy(out, a, na);
  std::memcpy(out + na, b, nb + 1);
  return true;
}

bool write_pid(int fd, pid_t pid) noexcept {
  if (fd < 0) return false;
  char digits[16], text[16];
  int n = 0, len = 0;
  for (pid_t v = pid; v > 0 && n < 15; v /= 10) digits[n++] = char('0' + v % 10);
  while (n > 0) text[len++] = digits[--n];
  return ::write(fd, text, size_t(len)) == len;
}

// The cgroup at `dir` with its control files open; inactive on failure.
Cgroup open_cgroup(const std::string& dir) {
  Cgroup cg;
  char path[600];
  if (dir.size() >= sizeof cg.dir) return cg;
  std::memcpy(cg.dir, dir.c_str(), dir.size() + 1);
  if (join(path, sizeof path, cg.dir, "/cgroup.procs"))
    cg.procs_fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (join(path, sizeof path, cg.dir, "/cgroup.kill"))
    cg.kill_fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (cg.procs_fd < 0 || cg.kill_fd < 0) {
    if (cg.procs_fd >= 0) ::close(cg.procs_fd);
    if (cg.kill_fd >= 0) ::close(cg.kill_fd);
    cg.procs_fd = cg.kill_fd = -1;
  }
  return cg;
}

bool probe() {
  const char* off = std::getenv("TOUCHSTONE_NO_CGROUP");
  if (off && std::strcmp(off, "0") != 0 && *off) return false;
  const std::string dir = own_cgroup_dir();
  if (dir.empty() || ::access(dir.c_str(), W_OK) != 0) return false;
  const std::string probe = dir + "/touchstone-probe-" + std::to_string(::getpid());
  if (::mkdir(probe.c_str(), 0755) != 0) return false;
  const bool has_kill = ::access((probe + "/cgroup.kill").c_str(), W_OK) == 0;
  ::rmdir(probe.c_str());
  return has_kill;
}

}  // namespace

bool cgroups_usable() {
  static const bool usable = probe();
  return usable;
}

const char* cleanup_mechanism() { return cgroups_usable() ? "cgroup v2" : "process-group sweep"; }

Cgroup cgroup_create() {
  if (!cgroups_usable()) return {};
  static std::atomic<int> counter{0};
  const std::string dir = own_cgroup_dir() + "/touchstone-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter++);
  if (::mkdir(dir.c_str(), 0755) != 0) return {};
  Cgroup cg = open_cgroup(dir);
  if (!cg.active()) ::rmdir(dir.c_str());
  return cg;
}

bool cgroup_enter(const Cgroup& cg, pid_t pid) noexcept { return write_pid(cg.procs_fd, pid); }

void cgroup_kill(const Cgroup& cg) noexcept {
  if (cg.kill_fd < 0) return;
  [[maybe_unused]] const ssize_t n = ::write(cg.kill_fd, "1", 1);
}

void cgroup_remove(Cgroup& cg, int budget_ms) noexcept {
  if (!cg.active()) return;
  // rmdir fails (EBUSY) until the last killed process has exited.
  for (int waited = 0;; waited += 2) {
    cgroup_kill(cg);
    if (::rmdir(cg.dir) == 0 || errno == ENOENT || waited >= budget_ms) break;
    timespec ts{0, 2000000};
    ::nanosleep(&ts, nullptr);
  }
  ::close(cg.procs_fd);
  ::close(cg.kill_fd);
  cg.procs_fd = cg.kill_fd = -1;
}

Cgroup cgroup_own() {
  const std::string dir = own_cgroup_dir();
  const size_t slash = dir.rfind('/');
  if (slash == std::string::npos || dir.compare(slash + 1, 11, "touchstone-") != 0) return {};
  return open_cgroup(dir);
}

bool cgroup_leave(const Cgroup& cg) noexcept {
  char parent[sizeof cg.dir];
  std::memcpy(parent, cg.dir, sizeof parent);
  char* slash = std::strrchr(parent, '/');
  if (!slash) return false;
  *slash = 0;
  char path[600];
  if (!join(path, sizeof path, parent, "/cgroup.procs")) return false;
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  const bool ok = write_pid(fd, ::getpid());
  if (fd >= 0) ::close(fd);
  return ok;
}

}  // namespace touchstone::proc
