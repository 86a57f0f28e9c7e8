// Internal: the golden file's checksum header (the 512-byte HDF5 user block).
// Not installed.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace touchstone::detail {

// The first kUserBlockSize bytes of a golden file are an HDF5 "user block"
// (ignored by HDF5, h5py, h5dump) holding a text header with the size and the
// sha256 of the rest of the file. The reader checks it before handing the
// bytes to libhdf5, which is not hardened against corrupted metadata (crafted
// files crash it, hang it or make it allocate gigabytes).
inline constexpr size_t kUserBlockSize = 512;

// Throws unless `bytes` start with a valid header matching the rest. With
// `trust`, a file without the header (damaged magic, another tool) passes;
// a header that is present but does not match is refused even then.
void verify_header(const std::string& where, std::string_view bytes, bool trust);

}  // namespace touchstone::detail
