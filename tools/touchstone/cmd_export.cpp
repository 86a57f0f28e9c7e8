// touchstone export --backend static_graph --model M --out DIR [--weights ...]
// Writes a backend's compiled-graph modules (for static_graph: TOSA 1.0 MLIR
// text for the prefill and decode graphs plus their weights, documented in
// docs/backends/static_graph.md). Each backend that can export ships an
// executable `touchstone-export-<backend, _ as ->` next to this binary; the CLI runs it,
// so the CLI itself never links MLIR.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "cli_common.h"
#include "touchstone/common/error.h"

namespace touchstone::cli {

void add_export(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string backend = "static_graph", model, out, weights = "full_precision";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Export a backend's compiled graphs (static_graph: TOSA MLIR + weights)");
  cmd->add_option("--backend,-b", o->backend, "Backend whose graphs to export");
  cmd->add_option("--model,-m", o->model, "GGUF model file")->required();
  cmd->add_option("--out,-o", o->out, "Output directory")->required();
  cmd->add_option("--weights", o->weights, "full_precision | quantized");
  cmd->callback([o, &exit_code] {
    (void)parse_weight_path(o->weights);  // validate early, with the usual message
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) throw Error("export: cannot locate the touchstone executable: {}", ec.message());
    std::string dashed = o->backend;  // static_graph -> touchstone-export-static-graph
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    const std::string tool = (exe.parent_path() / ("touchstone-export-" + dashed)).string();
    if (!std::filesystem::exists(tool)) {
      throw Error(
          "export: backend '{}' has no exporter ({} not found; only static_graph exports graphs)",
          o->backend, tool);
    }
    std::vector<std::string> args = {tool,   "--model",   o->model,  "--out",
                                     o->out, "--weights", o->weights};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw Error("export: fork failed");
    if (pid == 0) {
      execv(tool.c_str(), argv.data());
      _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) throw Error("export: waitpid failed");
    if (!WIFEXITED(status)) throw Error("export: {} terminated abnormally", tool);
    exit_code = WEXITSTATUS(status) == 0 ? 0 : kExitError;
  });
}

}  // namespace touchstone::cli
