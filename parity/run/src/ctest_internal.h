// ctest_internal.h - what the CTest generator's files share (ctest_plan.cpp,
// ctest_faults.cpp, ctest_script.cpp; touchstone/run/ctest_plan.h).
#pragma once

#include <string>
#include <vector>

#include "touchstone/run/ctest_plan.h"

namespace touchstone::ctest {

// One backend's generation state: its file, the --backend argument and the
// tests made so far.
struct Gen {
  const BackendFile& b;
  std::string backend_arg;
  const Manifest& manifest;
  const Manifest* test_models;
  const CtestContext& ctx;
  std::vector<CtestTest>& out;
};

// A test that exits 77 (SKIP) when the backend has no device here.
inline CtestTest skippable(std::string name, std::vector<std::string> command,
                           std::vector<std::string> labels, std::vector<std::string> environment,
                           int timeout, int processors, int cost = -1) {
  CtestTest t;
  t.name = std::move(name);
  t.command = std::move(command);
  t.labels = std::move(labels);
  t.environment = std::move(environment);
  t.timeout = timeout;
  t.processors = processors;
  t.skip_return_code = 77;
  t.cost = cost;
  return t;
}

// --profile P --known-divergences FILE of a weight path's parity entry (each
// where the entry has it; none without an entry).
std::vector<std::string> profile_options(const BackendFile& b, const std::string& weights);

// The fault CTests of gen.b's faults[] entries.
void add_fault_tests(const Gen& gen);

// Applies b's adjust[] entries to tests[first..]; an unmatched pattern is an Error.
void apply_adjust(const BackendFile& b, std::vector<CtestTest>& tests, size_t first);

}  // namespace touchstone::ctest
