// Shared pieces of the touchstone subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "touchstone/golden/manifest.h"
#include "touchstone/model/tokenizer.h"
#include "touchstone/run/parity_run.h"  // parse_weight_path, weight_path_name
#include "touchstone/runtime/backend.h"

namespace touchstone::cli {

// Exit codes: 0 = success / parity PASS, 1 = parity FAIL or check mismatch, 2 = error,
// 77 = skipped: the backend has no usable device on this machine.
inline constexpr int kExitFail = 1;
inline constexpr int kExitError = 2;
inline constexpr int kExitSkip = 77;  // no device for this backend here (CTest SKIP_RETURN_CODE)
// The backend refuses this model or weight path at setup (TS_ERR_UNSUPPORTED):
// not a PASS, not a silent SKIP; ci/parity lists it as UNSUPPORTED.
inline constexpr int kExitUnsupported = 3;
// The exit codes above, for --help texts.
inline constexpr const char* kExitCodesHelp =
    "Exit codes: 0 PASS or KNOWN_DIVERGENCE (or success), 1 FAIL (parity or check mismatch), 2 "
    "error (bad input, "
    "usage), 3 UNSUPPORTED (the backend refuses this model or weight path), 77 SKIP (no device "
    "for this backend here).";

// "goldens/manifest.json" (relative to the working directory; no fallback).
std::string default_manifest_path();
// For commands that only read goldens (parity): default_manifest_path() when it
// exists, else the installed goldens beside this executable
// (<prefix>/bin/../share/touchstone/goldens/manifest.json), else the former.
std::string checking_manifest_path();
Tokenizer load_tokenizer(const std::string& gguf_path);
// Revision of the git checkout holding the manifest (the user's project):
// `git describe --always --dirty --abbrev=40` there, or "unknown".
std::string source_revision(const std::string& manifest_path);
// --timeout's check: seconds in (0, 1e6]; NaN and infinity are refused.
CLI::Validator finite_seconds();

void add_run(CLI::App& app, int& exit_code);
void add_golden(CLI::App& app, int& exit_code);
void add_parity(CLI::App& app, int& exit_code);
void add_export(CLI::App& app, int& exit_code);
void add_summary(CLI::App& app, int& exit_code);
void add_merge(CLI::App& app, int& exit_code);
void add_matrix(CLI::App& app, int& exit_code);
void add_info(CLI::App& app, int& exit_code);
void add_tokenize(CLI::App& app, int& exit_code);
void add_image(CLI::App& app, int& exit_code);
void add_list(CLI::App& app, int& exit_code);

}  // namespace touchstone::cli
