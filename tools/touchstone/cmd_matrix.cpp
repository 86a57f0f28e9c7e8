// touchstone matrix [--root DIR] [--suite quick|full|smoke] [--manifest FILE]
// The parity runs the backends' backend.json files declare
// (touchstone/run/backend_file.h, docs/backend-file.md), one per line, for
// ci/parity to run: START<TAB>BACKEND<TAB>WEIGHTS<TAB>MODEL<TAB>SUITE[<TAB>FLAG]...
// (START: the backend's start order; rows are in matrix order, model by model).
// A malformed backend.json is an error naming the file and field (exit 2).
#include <fmt/format.h>

#include "cli_common.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/run/backend_file.h"

namespace touchstone::cli {
namespace {

// The sliding-window cases of a suite: attention both weight paths share, so
// the quick matrix runs them on the quantized path only.
constexpr const char* kSharedPathTag = "sliding_window";

struct MatrixOpts {
  std::string root = ".", suite = "quick", manifest;
};

int run_matrix(const MatrixOpts& o) {
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
  cmd->callback([o, &exit_code] { exit_code = run_matrix(*o); });
}

}  // namespace touchstone::cli
