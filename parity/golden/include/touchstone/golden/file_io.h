// touchstone/golden/file_io.h - whole-file reads and crash-safe whole-file writes
// (goldens, manifests' pins, parity reports). Every error names the file and
// the errno text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace touchstone::fileio {

// The whole file; throws Error "<path>: cannot read ...: <strerror>".
std::string read_file(const std::string& path, const char* what);

// Temp file next to `path`: "<dir>/.<name>.tmp-<pid>" (covered by .gitignore).
std::string temp_path(const std::string& path);

// Writes `bytes` to temp_path(path), fsyncs, closes, renames it over `path`
// and fsyncs the directory. On any error (ENOSPC, EIO, ...) the temp file is
// removed, `path` is left as it was and Error names the file and errno text.
void write_atomic(const std::string& path, std::string_view bytes);

// Removes "<dir>/.<name>.tmp-<pid>" and "<path>.tmp.<pid>" (the older
// pattern) left by killed writers: those whose pid is not a live process.
// Returns the removed paths.
std::vector<std::string> remove_stale_temps(const std::string& path);

std::string dir_of(const std::string& path);

}  // namespace touchstone::fileio
