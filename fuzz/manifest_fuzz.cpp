// libFuzzer target: the manifest parser (parity/golden load_manifest). Any
// input must parse or throw touchstone::Error (never a raw nlohmann or std
// exception, which would escape to the CLI without a file or field named).
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::MemFile file("manifest_fuzz");
  try {
    const touchstone::Manifest m = touchstone::load_manifest(file.write(data, size));
    // Lookups by every listed name must succeed.
    for (const auto& c : m.cases) (void)m.find_case(c.name);
    for (const auto& s : m.suites) (void)m.find_suite(s.name);
    for (const auto& p : m.profiles) (void)m.find_profile(p.name);
  } catch (const touchstone::Error&) {
  }
  return 0;
}
