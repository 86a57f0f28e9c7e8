// touchstone/harness/model_store.h - where model files live and how they are verified.
#pragma once

#include <string>

#include "touchstone/golden/manifest.h"

namespace touchstone {

// Model cache directory: $TOUCHSTONE_MODEL_DIR, else $HOME/.cache/touchstone/models.
std::string model_cache_dir();

// SHA-256 of a file as 64 lowercase hex chars (OpenSSL EVP). Throws Error naming the file.
std::string sha256_file(const std::string& path);
// The same, remembered in "<path>.sha256-cache" keyed by device, inode, size,
// mtime and ctime (any write changes ctime), so a model is hashed once per
// change of the file, not on every run.
std::string sha256_file_cached(const std::string& path);

// Path of `model` in the cache, verified against its manifest sha256. Throws
// Error when the file is missing (telling the user to run ci/bootstrap) or its
// checksum differs (naming both sums) - a wrong file is never silently used.
std::string resolve_model(const ManifestModel& model);

}  // namespace touchstone
