// my_parity.cpp - cpu_simd's quantized path on SmolLM2-135M (the smoke suite,
// the consistency and serving checks), one GoogleTest test per case and group.
#include <gtest/gtest.h>

#include "touchstone/run/gtest_parity.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  touchstone::ParityOptions o;
  o.manifest = MANIFEST;   // the installed goldens (find_package: TOUCHSTONE_MANIFEST)
  o.backend = "cpu_simd";  // or the path of your backend's .so, exec:..., http://...
  o.weights = "quantized";
  o.suite = "smoke";
  o.model = "smollm2-135m-instruct-q4_1";
  o.consistency_tokens = 32;
  o.serving_plan = "smoke";
  touchstone::register_parity_tests("CpuSimdQuantized", o);
  return RUN_ALL_TESTS();
}
