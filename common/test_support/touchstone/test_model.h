// test_model.h - where tests find the real model (SmolLM2-135M-Instruct Q4_1).
//
// $TOUCHSTONE_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf when the variable is
// set, else ~/.cache/touchstone/models/ (where ci/bootstrap caches it after
// checking its sha256). Tests SKIP with this path in the reason when the file
// is missing.
#pragma once

#include <cstdlib>
#include <string>

namespace touchstone::test {

inline std::string real_model_path() {
  const char* dir = std::getenv("TOUCHSTONE_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string d =
      dir && *dir ? dir : std::string(home ? home : "/root") + "/.cache/touchstone/models";
  return d + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace touchstone::test
