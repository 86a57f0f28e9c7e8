// HDF5 error-stack helpers and in-memory file names: see h5util.h.
#include "h5util.h"

#include <fmt/format.h>

#include <atomic>

namespace touchstone::h5 {

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err != nullptr && err->desc != nullptr) *out = err->desc;
  return 0;
}
}  // namespace

std::string take_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg;
}

std::string error_suffix() {
  std::string d = take_error();
  return d.empty() ? std::string() : " (HDF5: " + d + ")";
}

std::string memory_name() {
  static std::atomic<unsigned long> counter{0};
  return fmt::format("/dev/null/touchstone-golden-image-{}", counter++);
}

}  // namespace touchstone::h5
