// touchstone matrix [--root DIR] [--suite quick|full|smoke] [--manifest FILE]
// The parity runs the backends' backend.json files declare
// (touchstone/run/backend_file.h, docs/backend-file.md), one per line, for
// ci/parity to run: START<TAB>BACKEND<TAB>WEIGHTS<TAB>MODEL<TAB>SUITE[<TAB>FLAG]...
// (START: the backend's start order; rows are in matrix order, model by model).
//
// touchstone matrix --ctest OUT --backend-file FILE... [--backend-library NAME=PATH]...
//   --cli PATH --manifest FILE [--contract-test PATH] [--test-models FILE]
//   [--model-path GGUF] [--report-dir DIR] [--one-thread-env VAR=VALUE]...
// The CTests the given files declare (touchstone/run/ctest_plan.h), written to
// OUT as a CTest script (CMake's touchstone_add_backend_tests includes it), and
// OUT.d, the files read, as a Makefile depfile.
// A malformed backend.json is an error naming the file and field (exit 2).
#include <fmt/format.h>

#include <optional>

#include "cli_common.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/run/backend_file.h"
#include "touchstone/run/ctest_plan.h"

namespace touchstone::cli {
namespace {

// The sliding-window cases of a suite: attention both weight paths share, so
// the quick matrix runs them on the quantized path only.
constexpr const char* kSharedPathTag = "sliding_window";

struct MatrixOpts {
  std::string root = ".", suite = "quick", manifest;
  std::string ctest_out;
  std::vector<std::string> backend_files, libraries;
  CtestContext ctx;
};

int write_ctests(const MatrixOpts& o) {
  std::vector<CtestBackend> backends;
  for (const std::string& f : o.backend_files) backends.push_back({read_backend_file(f), ""});
  for (const std::string& l : o.libraries) {
    const size_t eq = l.find('=');
    const auto it = std::ranges::find_if(
        backends, [&](const CtestBackend& b) { return b.file.name == l.substr(0, eq); });
    if (eq == std::string::npos || it == backends.end())
      throw Error("--backend-library {}: expected NAME=PATH with NAME a --backend-file's name", l);
    it->library = l.substr(eq + 1);
  }
  const Manifest m = load_manifest(o.ctx.manifest);
  std::optional<Manifest> tm;
  if (!o.ctx.test_models.empty()) tm = load_manifest(o.ctx.test_models);
  const std::vector<CtestTest> tests = ctest_plan(backends, m, tm ? &*tm : nullptr, o.ctx);
  fileio::write_atomic(o.ctest_out, ctest_script(tests));
  // A Makefile-style depfile (add_custom_command DEPFILE): every file read, so
  // that a change to any of them regenerates the tests.
  std::string dep = o.ctest_out + ":";
  std::vector<std::string> read = {o.ctx.manifest};
  if (!o.ctx.test_models.empty()) read.push_back(o.ctx.test_models);
  for (const CtestBackend& b : backends) {
    read.push_back(b.file.path);
    for (const BackendTestModelEntry& e : b.file.testmodels)
      if (!e.manifest.empty()) read.push_back(e.manifest);
  }
  for (const std::string& f : read) {
    dep += " ";
    for (char c : f) dep += c == ' ' ? std::string("\\ ") : std::string(1, c);
  }
  fileio::write_atomic(o.ctest_out + ".d", dep + "\n");
  return 0;
}

int run_matrix(const MatrixOpts& o) {
  if (!o.ctest_out.empty()) return write_ctests(o);
  const Manifest m =
      load_manifest(o.manifest.empty() ? o.root + "/goldens/manifest.json" : o.manifest);
  std::vector<std::string> models, shared;
  for (const ManifestModel& mm : m.models) models.push_back(mm.name);
  for (const std::string& c : m.find_suite(o.suite).cases)
    if (std::ranges::count(m.find_case(c).tags, kSharedPathTag) > 0) shared.push_back(c);
  for (const MatrixRow& r : matrix_rows(find_backend_files(o.root), models, shared, o.suite)) {
    fmt::print("{}\t{}\t{}\t{}\t{}", r.start, r.backend, r.weights, r.model, r.suite);
    for (const std::string& a : r.args) fmt::print("\t{}", a);
    fmt::print("\n");
  }
  return 0;
}

}  // namespace

void add_matrix(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<MatrixOpts>();
  CLI::App* cmd = app.add_subcommand(
      "matrix", "The parity runs the backends' backend.json files declare (ci/parity runs them)");
  cmd->add_option("--root", o->root, "Source tree holding backends/*/backend.json (default .)");
  cmd->add_option("--suite", o->suite, "Suite of the matrix: quick (default), full or smoke");
  cmd->add_option("--manifest", o->manifest, "Manifest (default ROOT/goldens/manifest.json)");
  cmd->add_option("--ctest", o->ctest_out,
                  "Write the --backend-file files' CTests to this CTest script");
  cmd->add_option("--backend-file", o->backend_files, "A backend.json whose CTests --ctest writes");
  cmd->add_option("--backend-library", o->libraries,
                  "NAME=PATH: the --backend argument of that file's tests (default: its name)");
  cmd->add_option("--cli", o->ctx.cli, "The touchstone executable the tests run");
  cmd->add_option("--contract-test", o->ctx.contract_test,
                  "The touchstone-contract-test executable");
  cmd->add_option("--test-models", o->ctx.test_models, "The test models' manifest (testmodels[])");
  cmd->add_option("--model-path", o->ctx.model_path, "The contract suite's model (a GGUF)");
  cmd->add_option("--report-dir", o->ctx.report_dir, "Where the tests write their JUnit reports");
  cmd->add_option("--one-thread-env", o->ctx.one_thread_env,
                  "VAR=VALUE of the tests that run the backend on one thread");
  cmd->callback([o, &exit_code] {
    if (!o->ctest_out.empty()) o->ctx.manifest = o->manifest;
    exit_code = run_matrix(*o);
  });
}

}  // namespace touchstone::cli
