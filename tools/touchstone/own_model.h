// own_model.h - goldens for a user's own GGUF and cases, without editing the repo:
// `touchstone golden --model PATH.gguf --cases CASES.json --out DIR` writes
// DIR/manifest.json (this file's job) and then records DIR/<name>.h5 as usual;
// `touchstone parity --goldens DIR --backend X` checks against them.
#pragma once

#include <string>

namespace touchstone::cli {

// CASES.json: {"cases": [...], "scoring": [...] (optional), "suites": {...} (optional)}
// or a bare array of cases. A case is a manifest case without "model" ({"name",
// "prompt", "n_predict", "chat" (optional), "tags" (optional)}); a scoring passage is
// {"name", "text"} or {"name", "text_file"} (relative to CASES.json), copied into
// DIR/passages/. The model entry gets name (default: the file's stem, with
// characters outside [A-Za-z0-9._-] replaced by '_'), the GGUF's absolute "path",
// its sha256 and golden "<name>.h5"; the profiles are the project's.
// Validates everything (errors name CASES.json and the JSON pointer) before writing
// DIR/manifest.json atomically; creates DIR if needed. Returns the manifest's path.
std::string write_own_manifest(const std::string& gguf_path, const std::string& cases_path,
                               const std::string& out_dir, std::string name);

}  // namespace touchstone::cli
