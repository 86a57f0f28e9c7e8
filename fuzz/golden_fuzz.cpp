// libFuzzer target: the golden-file reader (parity/golden).
// Any input must read or throw touchstone::Error; a file that reads must pass
// validate_golden (the reader's own promise) and diff equal to itself.
//
// Built twice:
//  * golden_fuzz (CI): read_golden_file on the input as is, as the CLI reads
//    a golden. Mutations of a stamped seed fail the header's sha256, which is
//    the point: a damaged file is refused before libhdf5 sees a byte. This
//    covers the header check and the refusal paths.
//  * golden_hdf5_fuzz (TOUCHSTONE_FUZZ_TRUST, long runs only): the lower
//    level. An input of at least 512 bytes gets a valid header stamped over
//    its first 512 bytes (stamp_golden_header), so the mutated HDF5 body
//    reaches libhdf5 as a well-hashed but hostile file would (a swapped golden
//    with a re-written pin); a shorter one is parsed with trust (what
//    --trust-goldens does with a file that has no header). Crashes inside
//    libhdf5 are not fixable here; they show what the header and the pinned
//    hash in the manifest must stop.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "fuzz_util.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
#ifdef TOUCHSTONE_FUZZ_TRUST
    constexpr size_t kUserBlockSize = 512;
    std::string bytes(reinterpret_cast<const char*>(data), size);
    const bool stamp = size >= kUserBlockSize;
    if (stamp) bytes = touchstone::stamp_golden_header(std::move(bytes));
    const touchstone::GoldenFile g = touchstone::parse_golden_bytes("fuzz", bytes, !stamp);
#else
    static touchstone::fuzz::MemFile file("golden_fuzz");
    const touchstone::GoldenFile g = touchstone::read_golden_file(file.write(data, size));
#endif
    touchstone::validate_golden(g, "fuzz");
    if (!touchstone::diff_golden(g, g).empty()) std::abort();
  } catch (const touchstone::Error&) {
  }
  return 0;
}
