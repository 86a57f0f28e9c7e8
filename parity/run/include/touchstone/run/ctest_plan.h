// ctest_plan.h - the CTests of the backends' backend.json files
// (docs/backend-file.md), generated at build time by `touchstone matrix
// --ctest` into a CTest script that CMake includes (TEST_INCLUDE_FILES), so
// that the matrix's policy is read from the files alone (no manifest parsed in
// CMake, one list of fault expectations: touchstone/run/fault_expectations.h).
//
// Per backend file, in this order (test names as docs/backend-file.md lists):
//   parity.<b>.<w>.<case> | .scoring.<passage> | .consistency   (parity[])
//   serving.<b>.<w>.<model>[.full]                               (serving[])
//   structured.<b>.<w>.<model or case>                           (structured[])
//   contract.<b>.<w>[.child]                                     (contract[])
//   fault.<b>.<w>.<fault>                                        (faults[])
//   testmodel.<b>.<w>.<model>                                    (testmodels[])
// then the file's adjust[] entries in order.
#pragma once

#include <string>
#include <vector>

#include "touchstone/golden/manifest.h"
#include "touchstone/run/backend_file.h"

namespace touchstone {

// One CTest test: its command and properties (0 / "" = the property unset).
struct CtestTest {
  std::string name;
  std::vector<std::string> command;
  std::vector<std::string> labels, environment;
  int timeout = 0, processors = 0, skip_return_code = 0;
  int cost = -1;  // -1 = unset
  std::string resource_groups;
};

// What the generated commands run and read (absolute paths).
struct CtestContext {
  std::string cli;            // the touchstone executable
  std::string contract_test;  // touchstone-contract-test ("" = no contract tests may be declared)
  std::string manifest;       // goldens/manifest.json
  std::string test_models;    // tests/models/manifest.json ("" = no testmodels may be declared)
  std::string model_path;     // the contract suite's model (the manifest's first GGUF)
  std::string report_dir;     // where --junit reports go
  std::vector<std::string> one_thread_env;  // e.g. LP_NUM_THREADS=1, OMP_NUM_THREADS=1
};

// A backend file and what --backend names: its name, or a library path for a
// backend built outside the tree (`touchstone_add_parity_tests(TARGET ...)`).
struct CtestBackend {
  BackendFile file;
  std::string library;  // "" = file.name
};

// The tests of every backend, in order. Throws Error (naming the file and
// JSON pointer) for a suite, case or model the manifest lacks, a fault no
// expectation set names, a test declared twice, or an adjust pattern that
// matches no test.
std::vector<CtestTest> ctest_plan(const std::vector<CtestBackend>& backends,
                                  const Manifest& manifest, const Manifest* test_models,
                                  const CtestContext& ctx);

// The tests as a CTest script (add_test / set_tests_properties with bracket
// arguments), as CMake writes CTestTestfile.cmake.
std::string ctest_script(const std::vector<CtestTest>& tests);

}  // namespace touchstone
