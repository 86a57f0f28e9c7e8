// Whole-file I/O for goldens and the manifest: see file_io.h.
#include "touchstone/golden/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "touchstone/common/error.h"

namespace touchstone::fileio {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Closes on scope exit unless released; close errors are reported by close_checked.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int close_checked() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

void write_all(int fd, std::string_view bytes, const std::string& tmp) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      throw Error("{}: write failed after {} of {} bytes: {}", tmp, done, bytes.size(),
                  errno_text(e));
    }
    done += static_cast<size_t>(n);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

std::string base_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

bool process_alive(const std::string& pid_text) {
  if (pid_text.size() > 9) return false;
  const long pid = std::stol(pid_text);
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string read_file(const std::string& path, const char* what) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error("{}: cannot open {}: {}", path, what, errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw Error("{}: cannot stat {}: {}", path, what, errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw Error("{}: cannot read {}: not a regular file", path, what);
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("{}: cannot read {}: {}", path, what, errno_text(errno));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string temp_path(const std::string& path) {
  const std::string dir = dir_of(path);
  const std::string prefix = path.rfind('/') == std::string::npos ? std::string() : dir + "/";
  return prefix + "." + base_of(path) + ".tmp-" + std::to_string(static_cast<long>(::getpid()));
}

void write_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = temp_path(path);
  ::unlink(tmp.c_str());  // a leftover of an earlier process with our pid
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw Error("{}: cannot create temp file: {}", tmp, errno_text(errno));
  try {
    write_all(fd.get(), bytes, tmp);
    if (::fsync(fd.get()) != 0) throw Error("{}: fsync failed: {}", tmp, errno_text(errno));
    if (fd.close_checked() != 0) throw Error("{}: close failed: {}", tmp, errno_text(errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("{}: cannot rename {} over it: {}", path, tmp, errno_text(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(dir_of(path));
}

std::vector<std::string> remove_stale_temps(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string base = base_of(path);
  const std::string new_prefix = "." + base + ".tmp-", old_prefix = base + ".tmp.";
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_of(path), ec)) {
    const std::string name = entry.path().filename().string();
    std::string pid;
    if (name.rfind(new_prefix, 0) == 0)
      pid = name.substr(new_prefix.size());
    else if (name.rfind(old_prefix, 0) == 0)
      pid = name.substr(old_prefix.size());
    else
      continue;
    if (!all_digits(pid) || process_alive(pid)) continue;
    if (::unlink(entry.path().c_str()) == 0) removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace touchstone::fileio
