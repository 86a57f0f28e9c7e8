// touchstone/conformance/target.h - what one run of the contract conformance
// suite (touchstone-contract-test) checks: one backend, one weight path, one
// GGUF. CMake registers a run with touchstone_add_contract_tests(BACKEND
// WEIGHTS ...) (cmake/TouchstoneParity.cmake), which passes these as flags.
#pragma once

#include <string>

namespace touchstone::conformance {

struct Target {
  std::string backend;                     // a backend name or a library path
  std::string weights = "full_precision";  // full_precision | quantized
  std::string model;                       // the GGUF; empty: every test SKIPs
  // A profile of `manifest` (goldens/manifest.json) for the serving comparisons
  // (step_batch, fork) of a backend without TS_CAP_BATCH_INVARIANT; "" = the
  // suite's own tolerance (docs/contract.md).
  std::string profile;
  std::string manifest;
  bool child = false;  // through touchstone-backend-runner (docs/protocol.md)
};

// Parses the suite's own flags, after GoogleTest has removed its --gtest_*:
//   --backend NAME|PATH (required) --weights full_precision|quantized
//   --model GGUF --profile NAME --manifest JSON --child
// Throws std::invalid_argument naming the flag (an unknown one, a missing
// value, a weight path that is neither, --profile without --manifest).
Target parse_target(int argc, char** argv);

// The target of this run (set once by the suite's main before any test runs).
const Target& target();
void set_target(Target t);

}  // namespace touchstone::conformance
