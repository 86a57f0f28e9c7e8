// libFuzzer target: the golden-file reader (parity/golden read_golden_file).
// Any input must read or throw touchstone::Error; a file that reads must pass
// validate_golden (the reader's own promise) and diff equal to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "touchstone/error.h"
#include "touchstone/golden.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::MemFile file("golden_fuzz");
  try {
    const touchstone::GoldenFile g = touchstone::read_golden_file(file.write(data, size));
    touchstone::validate_golden(g, "fuzz");
    if (!touchstone::diff_golden(g, g).empty()) std::abort();
  } catch (const touchstone::Error&) {
  }
  return 0;
}
