// backend_file.h - a backend's declared place in the parity matrix: its
// backend.json (docs/backend-file.md), read by `touchstone matrix` (the rows
// ci/parity runs, and with --ctest the backend's CTests: touchstone/run/ctest_plan.h).
//
//   {"touchstone_backend": 1, "name": "cpu_simd",
//    "parity": [{"weights": "quantized", "tier": "quantized", "models": [...],
//                "slow_tags": [...], "ci_suite": "quick", "profile": "...",
//                "known_divergences": "file.json", "why": "..."}, ...],
//    "matrix": {"start": 4, "serving_plan": "quick",
//               "quick": {"suite": "smoke", "max_steps": 16, "golden_free": false},
//               "paths": [{"weights": "full_precision", "models": [...]}, ...]}}
#pragma once

#include <string>
#include <vector>

namespace touchstone {

// One weight path's parity CTests (touchstone/run/ctest_plan.h).
struct BackendParityEntry {
  std::string weights, tier, profile, ci_suite;
  std::string known_divergences;               // absolute path ("" = none)
  std::vector<std::string> models, slow_tags;  // empty models = the manifest's first
  std::string why;
};

// One group of serving CTests (serving.<b>.<w>.<model>[.full]): a weight path on
// models (empty = every model), a serving plan ("" = quick), extra labels; the
// profile and known divergences are its weight path's parity entry's.
struct BackendServingEntry {
  std::string weights;
  std::vector<std::string> models;
  std::string plan;
  std::vector<std::string> labels;
  std::string why;
};

// One group of structured-output CTests: a
// weight path on each of `models` (structured.<b>.<w>.<model>) or each of
// `cases` (structured.<b>.<w>.<case>); profile and known divergences are its
// weight path's parity entry's.
struct BackendStructuredEntry {
  std::string weights;
  std::vector<std::string> models, cases, labels;
};

// One contract conformance CTest (contract.<b>.<w>[.child]): `profile` for
// its step_batch / fork comparisons ("" = bitwise), `child`: the backend in
// touchstone-backend-runner; `environment`: what the backend itself needs.
struct BackendContractEntry {
  std::string weights, profile;
  bool child = false;
  std::vector<std::string> labels, environment;
};

// One group of fault CTests (fault.<b>.<w>.<fault>): the faults of the named
// expectation sets (touchstone/run/fault_expectations.h), narrowed to `only`
// (empty = all) less `exclude`, with `expect` overriding a fault's expected
// place (fault -> EXPECT), `slow` ones labelled slow, `max_steps` greedy steps
// (0 = 4).
struct BackendFaultEntry {
  std::string weights;
  std::vector<std::string> sets, only, exclude, slow;
  std::vector<std::pair<std::string, std::string>> expect;
  int max_steps = 0;
};

// The test-model CTests (testmodel.<b>.<w>.<model>): every model of a test-model
// manifest (tests/models/manifest.json, or `manifest`) on each weight path but the
// `exclude` model:weights pairs.
struct BackendTestModelEntry {
  std::vector<std::string> weights, labels, environment, exclude;
  int timeout = 0;                // seconds, 0 = 300
  std::string manifest;           // absolute path; "" = the generator's test-model manifest
  std::vector<std::string> args;  // more `touchstone parity` flags (e.g. --no-serving)
  std::string known_divergences;  // absolute path ("" = none): --known-divergences
};

// A change to generated CTests by name (fnmatch patterns in `tests`, less
// those matching `except`): labels added or removed, the environment
// replaced, CTest RESOURCE_GROUPS set. Each pattern must match a test.
struct BackendAdjust {
  std::vector<std::string> tests, except, labels, remove_labels, environment;
  bool set_environment = false;
  std::string resource_groups;
  std::string ptr;  // where it is in the file, for errors
};

// One weight path of the matrix ci/parity runs; empty models = every model.
struct BackendMatrixPath {
  std::string weights;
  std::vector<std::string> models;
};

struct BackendFile {
  std::string path, name;
  std::vector<BackendParityEntry> parity;
  std::vector<BackendServingEntry> serving;
  std::vector<BackendStructuredEntry> structured;
  std::vector<BackendContractEntry> contract;
  std::vector<BackendFaultEntry> faults;
  std::vector<BackendTestModelEntry> testmodels;
  std::vector<BackendAdjust> adjust;
  int start = 0;             // the matrix starts rows of lower `start` first (longest first)
  std::string serving_plan;  // "" = the suite's
  // The quick matrix's row of this backend: another suite and step trim, and
  // whether the golden-free checks (consistency, serving, structured) run here.
  std::string quick_suite;
  int quick_max_steps = 0;
  bool golden_free = true;
  std::vector<BackendMatrixPath> paths;
  const BackendParityEntry* parity_for(const std::string& weights) const;
};

// Reads and checks one backend.json; throws Error naming the file and field.
BackendFile read_backend_file(const std::string& path);
// Every backend.json under root: backends/*/backend.json and
// reference/backend/backend.json, sorted by path.
std::vector<BackendFile> find_backend_files(const std::string& root);

// One `touchstone parity` run of the matrix.
struct MatrixRow {
  std::string backend, weights, model, suite;
  std::vector<std::string> args;  // the other flags of the run
  int start = 0;
};

// The matrix of `suite` over `models` (the manifest's, in order): per model,
// per backend (in start order), per matrix path; each row with its profile,
// known divergences and serving plan from the backend's file. For the quick
// suite, the golden-free checks run once per backend (on the first model, on
// its quantized path when it has one, the structured checks beside them), and
// `shared_path_cases` (cases whose point is code both weight paths share, e.g.
// the window-crossing long prompt) on the quantized path only when there is one.
std::vector<MatrixRow> matrix_rows(const std::vector<BackendFile>& backends,
                                   const std::vector<std::string>& models,
                                   const std::vector<std::string>& shared_path_cases,
                                   const std::string& suite);

}  // namespace touchstone
