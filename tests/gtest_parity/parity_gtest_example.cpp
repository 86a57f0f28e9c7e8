// parity_gtest_example.cpp - what a team's own test binary looks like with
// touchstone/run/gtest_parity.h: cpu_simd's quantized path on SmolLM2-135M
// (the manifest's smoke suite, the consistency and serving checks), one
// GoogleTest test per case and group, listed by ctest.
#include <gtest/gtest.h>

#include <filesystem>

#include "touchstone/run/gtest_parity.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  touchstone::ParityOptions o;
  o.manifest = TOUCHSTONE_RUN_MANIFEST;
  o.backend = "cpu_simd";
  o.weights = "quantized";
  o.suite = "smoke";
  o.model = "smollm2-135m-instruct-q4_1";
  o.consistency_tokens = 32;
  o.serving_plan = "smoke";
  if (std::filesystem::exists(TOUCHSTONE_RUN_MODEL)) {
    touchstone::register_parity_tests("CpuSimdQuantized", o);
  } else {  // a machine without the model (ci/fetch_models.py): one skipped test saying so
    struct NoModel : ::testing::Test {
      void TestBody() override { GTEST_SKIP() << "model not found: " TOUCHSTONE_RUN_MODEL; }
    };
    ::testing::RegisterTest("CpuSimdQuantized", "model", nullptr, nullptr, __FILE__, __LINE__,
                            []() -> ::testing::Test* { return new NoModel; });
  }
  return RUN_ALL_TESTS();
}
