// libFuzzer target: the golden-file reader (parity/golden read_golden_file).
// Any input must read or throw touchstone::Error; a file that reads must pass
// validate_golden (the reader's own promise) and diff equal to itself.
//
// Built twice:
//  * golden_fuzz (CI): the input as is. Mutations of a stamped seed mostly
//    fail the reader's header checksum, which is the point: a damaged file is
//    refused before libhdf5 sees a byte.
//  * golden_hdf5_fuzz (TOUCHSTONE_FUZZ_RESTAMP, long runs only): an input
//    that starts with the header magic gets a header whose checksum matches
//    its body, so the mutated HDF5 body reaches libhdf5 as a well-hashed but
//    hostile file would (a swapped golden). Crashes inside libhdf5 are not
//    fixable here; they show what the pinned hash in the manifest must stop.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fuzz_util.h"
#include "touchstone/error.h"
#include "touchstone/golden.h"

namespace {

#ifdef TOUCHSTONE_FUZZ_RESTAMP
// Mirrors checksum_header() in parity/golden/src/golden.cpp (format 1). If the
// header format changes, restamped inputs are refused and this target loses
// depth (not correctness); update it with the format.
constexpr size_t kUserBlockSize = 512;
constexpr const char* kMagic = "TOUCHSTONE-GOLDEN\n";

std::vector<uint8_t> restamp(const uint8_t* data, size_t size) {
  std::vector<uint8_t> out(data, data + size);
  const size_t magic_len = std::strlen(kMagic);
  if (size < kUserBlockSize || std::memcmp(data, kMagic, magic_len) != 0) return out;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = kUserBlockSize; i < size; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  std::string header = fmt::format("{}format {}\nbytes {}\nfnv1a64 {:016x}\n", kMagic,
                                   touchstone::kGoldenFormatVersion, size - kUserBlockSize, h);
  header.resize(kUserBlockSize, '\0');
  std::memcpy(out.data(), header.data(), kUserBlockSize);
  return out;
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::MemFile file("golden_fuzz");
#ifdef TOUCHSTONE_FUZZ_RESTAMP
  const std::vector<uint8_t> bytes = restamp(data, size);
  data = bytes.data();
  size = bytes.size();
#endif
  try {
    const touchstone::GoldenFile g = touchstone::read_golden_file(file.write(data, size));
    touchstone::validate_golden(g, "fuzz");
    if (!touchstone::diff_golden(g, g).empty()) std::abort();
  } catch (const touchstone::Error&) {
  }
  return 0;
}
