// cpu_simd_targets.cpp - touchstone-cpu-simd-targets: the Highway targets
// compiled into cpu_simd, which of them this CPU runs, and the wrapper of the
// per-target CTests (cpu_simd.unit.<T>, parity.cpu_simd.<T>.*; see
// docs/backends/cpu_simd.md, "ISA targets").
//
//   touchstone-cpu-simd-targets
//       one line per compiled target, best first: runs here or not, int8 level
//   touchstone-cpu-simd-targets --compiled FILE
//       the compiled target names, one a line, into FILE (read by CTest)
//   touchstone-cpu-simd-targets --run T [--expect-device FILE] -- CMD ARGS...
//       exits 77 (CTest SKIP) with the reason when this CPU cannot run T, or
//       when T is what the unforced tests already run here (the best target
//       with this CPU's best int8 level); else runs CMD with
//       TOUCHSTONE_CPU_SIMD_TARGET=T and exits with its status. --expect-device:
//       CMD's success also needs FILE (its parity --json report) to name T as
//       the forced Highway target.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels.h"

namespace {

using touchstone::cpu_simd::IsaTarget;

int usage() {
  std::fprintf(stderr,
               "usage: touchstone-cpu-simd-targets [--compiled FILE | --run TARGET "
               "[--expect-device REPORT.json] -- COMMAND ARGS...]\n");
  return 2;
}

std::string runnable_names(const std::vector<IsaTarget>& ts) {
  std::string out;
  for (const IsaTarget& t : ts) {
    if (t.runnable) out += (out.empty() ? "" : " ") + t.name;
  }
  return out.empty() ? "none" : out;
}

int list(const std::vector<IsaTarget>& ts) {
  std::printf(
      "Highway targets compiled into cpu_simd (best first; TOUCHSTONE_CPU_SIMD_TARGET=<name> "
      "forces one):\n");
  for (const IsaTarget& t : ts) {
    std::printf("  %-8s %-24s int8 kernels up to %s\n", t.name.c_str(),
                t.runnable ? "runs on this CPU" : "this CPU cannot run it",
                touchstone::cpu_simd::qlevel_name(touchstone::cpu_simd::qlevel_cap(t.bit)));
  }
  std::printf("this CPU: best int8 kernels %s\n",
              touchstone::cpu_simd::qlevel_name(touchstone::cpu_simd::qlevel_best()));
  return 0;
}

int write_compiled(const std::vector<IsaTarget>& ts, const char* path) {
  std::ofstream f(path);
  for (const IsaTarget& t : ts) f << t.name << "\n";
  f.close();
  if (!f) {
    std::fprintf(stderr, "touchstone-cpu-simd-targets: cannot write %s\n", path);
    return 1;
  }
  return 0;
}

// CMD's status, or 1 when it could not be run.
int run_child(char** argv) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("touchstone-cpu-simd-targets: fork");
    return 1;
  }
  if (pid == 0) {
    execvp(argv[0], argv);
    std::perror(argv[0]);
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) {
    std::perror("touchstone-cpu-simd-targets: waitpid");
    return 1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  std::fprintf(stderr, "touchstone-cpu-simd-targets: %s killed by signal %d\n", argv[0],
               WTERMSIG(status));
  return 1;
}

int run(const std::vector<IsaTarget>& ts, const std::string& target, const char* expect_device,
        char** cmd) {
  const IsaTarget* found = nullptr;
  for (const IsaTarget& t : ts) {
    if (t.name == target) found = &t;
  }
  if (!found) {
    std::string all;
    for (const IsaTarget& t : ts) all += " " + t.name;
    std::fprintf(stderr, "FAIL: %s is not a Highway target compiled into cpu_simd (compiled:%s)\n",
                 target.c_str(), all.c_str());
    return 1;
  }
  if (!found->runnable) {
    std::printf("SKIP: this CPU cannot run the Highway target %s (it runs: %s)\n", target.c_str(),
                runnable_names(ts).c_str());
    return 77;
  }
  const IsaTarget* best = nullptr;
  for (const IsaTarget& t : ts) {
    if (!best && t.runnable) best = &t;
  }
  if (best == found &&
      touchstone::cpu_simd::qlevel_cap(found->bit) >= touchstone::cpu_simd::qlevel_best()) {
    std::printf("SKIP: %s with int8 kernels %s is this CPU's default; the unforced tests run it\n",
                target.c_str(),
                touchstone::cpu_simd::qlevel_name(touchstone::cpu_simd::qlevel_best()));
    return 77;
  }
  // The best target with its int8 kernels capped below this CPU's: its fp32
  // kernels are the unforced tests', and its int8 kernels are the ones the next
  // target with the same cap runs (AVX3 on an AVX-512 VNNI CPU: avx2 int8
  // kernels, which the forced AVX2 run tests). Nothing here is new.
  const auto cap = touchstone::cpu_simd::qlevel_cap(found->bit);
  for (const IsaTarget& t : ts) {
    if (best != found || &t == found || !t.runnable) continue;
    if (touchstone::cpu_simd::qlevel_cap(t.bit) != cap) continue;
    std::printf(
        "SKIP: %s is this CPU's default target (the unforced tests run its fp32 kernels) and "
        "its int8 kernels %s are the ones forced %s runs\n",
        target.c_str(), touchstone::cpu_simd::qlevel_name(cap), t.name.c_str());
    return 77;
  }
  if (setenv("TOUCHSTONE_CPU_SIMD_TARGET", target.c_str(), 1) != 0) {
    std::perror("setenv");
    return 1;
  }
  if (expect_device) std::remove(expect_device);
  std::printf("TOUCHSTONE_CPU_SIMD_TARGET=%s (int8 kernels up to %s)\n", target.c_str(),
              touchstone::cpu_simd::qlevel_name(touchstone::cpu_simd::qlevel_cap(found->bit)));
  const int rc = run_child(cmd);
  if (rc != 0 || !expect_device) return rc;
  std::ifstream f(expect_device);
  std::stringstream text;
  text << f.rdbuf();
  const std::string want = "Highway " + target + " (forced by TOUCHSTONE_CPU_SIMD_TARGET)";
  if (text.str().find(want) == std::string::npos) {
    std::fprintf(stderr, "FAIL: the report %s does not name the device \"... %s ...\"\n",
                 expect_device, want.c_str());
    return 1;
  }
  std::printf("device check: %s names \"%s\"\n", expect_device, want.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<IsaTarget> ts = touchstone::cpu_simd::compiled_hwy_targets();
  if (argc == 1) return list(ts);
  const std::string a1 = argv[1];
  if (a1 == "--compiled" && argc == 3) return write_compiled(ts, argv[2]);
  if (a1 != "--run" || argc < 5) return usage();
  const std::string target = argv[2];
  const char* expect_device = nullptr;
  int i = 3;
  if (std::string(argv[i]) == "--expect-device" && i + 1 < argc) {
    expect_device = argv[i + 1];
    i += 2;
  }
  if (i + 1 >= argc || std::string(argv[i]) != "--") return usage();
  return run(ts, target, expect_device, argv + i + 1);
}
