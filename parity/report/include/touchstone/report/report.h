// touchstone/report/report.h - the parity report: console table, JSON and JUnit XML.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "touchstone/harness/parity.h"

namespace touchstone {

// The JSON report's "schema_version" (docs/report-format.md, docs/report.schema.json):
// additive changes keep it, renaming or removing a field bumps it.
inline constexpr int kReportSchemaVersion = 2;

// What the backend declared (ts_capabilities), by name.
struct BackendCapabilities {
  std::vector<std::string> flags;         // TS_CAP_* names: "all_position_logits", ...
  std::vector<std::string> weight_types;  // GGUF type names: "F32", "Q4_1", ...
  int32_t max_context = 0;                // tokens; 0 = limited only by the model
  std::vector<int32_t> shape_buckets;     // static prefill lengths (TS_CAP_STATIC_SHAPES)
  std::string determinism_note;           // "" when the backend gave none
  int32_t top_n = 0;                      // ABI v5 TS_CAP_TOP_N_LOGPROBS: N; else 0
  // ABI v6: weight paths covered by TS_CAP_BATCH_INVARIANT ("full_precision",
  // "quantized"; empty without the flag) and the most entries per step_batch (0 = no limit).
  std::vector<std::string> batch_invariant_paths;
  int32_t max_batch = 0;
};

struct RunInfo {
  std::string backend, backend_path, device, weight_path, profile, suite, model_name, model_sha256;
  int n_threads = 0;
  // "child process (time limit 300 s per call)" or "in process".
  std::string execution;
  std::string backend_version;  // "" when the backend did not start
  uint32_t backend_api_version = 0;
  std::optional<BackendCapabilities> capabilities;  // empty when the backend did not say
  std::string model_file;                           // the GGUF's file name
  // The Touchstone build that made the report (compiled in at configure time).
  std::string touchstone_version, touchstone_revision;
  // UTC ISO 8601 ("2026-11-25T18:37:00Z"); finished_at is "" until the run is complete.
  std::string started_at, finished_at;
  std::optional<Profile> tolerances;  // the profile's thresholds
  // Serving checks (touchstone/harness/serving.h) only, else "": how batches and forks
  // ran ("native", "looped by the backend", "emulated by the harness").
  std::string batching, fork;
};

// A planned check the backend cannot support (a top-N server cannot score a
// passage's every position or give full rows): reported as NOT SUPPORTED in
// every format, never run, never counted as passed.
struct NotSupportedCheck {
  std::string check, reason;
};

// A shard of a plan split over machines (touchstone/run/shard.h): what
// `touchstone merge` needs to put the shards' reports back together.
struct ShardInfo {
  int index = 0, count = 1;
  // sha256 of what decides the results (backend, weight path, profile, suite,
  // model, trims, checks, faults, known divergences) and the plan's items;
  // the golden file's pinned sha256.
  std::string plan_digest, goldens_digest;
  std::vector<std::string> plan_items;  // every item of the plan, in run order
  std::vector<std::string> items;       // this shard's
  std::string host;                     // the machine that ran it (hostname)
};

struct Report {
  RunInfo info;
  std::optional<ShardInfo> shard;  // set when the run is one shard of a plan
  std::vector<CaseResult> cases;
  std::vector<ScoringResult> scoring;
  std::vector<NotSupportedCheck> not_supported;
  // False while the run is going on (reports are rewritten after every case):
  // a report left by a killed run says so.
  bool complete = false;
  int n_planned = 0;  // cases + passages the run set out to check
  // Set when the run could not check anything: the backend has no device here
  // (TS_ERR_DEVICE) or refuses this model / weight path (TS_ERR_UNSUPPORTED)
  // before the first check ran; after that the same status is a FAIL row
  // (docs/report-format.md#verdict-order).
  std::string skipped, unsupported;
  double seconds = 0.0;  // wall time of the whole run
  // True only for a complete run with at least one result, every one PASS or
  // a reviewed known divergence (touchstone/harness/known_divergence.h).
  bool passed() const;
  // True once any check has a result row.
  bool started() const { return !cases.empty() || !scoring.empty(); }
  int n_known_divergences() const;
  // The verdict order (docs/report-format.md#verdict-order): "FAIL" when any
  // row failed, whatever else the run says; else "SKIP", "UNSUPPORTED",
  // "INCOMPLETE", "FAIL" (nothing checked), "KNOWN_DIVERGENCE" (passed(), with
  // at least one known divergence) or "PASS".
  std::string verdict() const;
};

// Human-readable table (backend x case: verdict, tokens matched, first divergence, NMSE, KLD)
// followed by one line per failure reason.
std::string format_table(const Report& r);
// Machine-readable, every number in the table and more; the format is
// docs/report-format.md, validated by docs/report.schema.json.
std::string to_json(const Report& r);
std::string to_junit(const Report& r);  // one <testcase> per case / scoring passage

// "YYYY-MM-DDTHH:MM:SSZ" (UTC) for `t`.
std::string utc_timestamp(std::chrono::system_clock::time_point t);

// A case's first failing step: the first step whose logits break the profile
// or whose argmax differs without being an accepted near-tie; -1 when none.
int first_failing_step(const CaseResult& c);

// Writes `content` to `path` atomically: a temp file ".<name>.tmp-<pid>" in
// the same directory, written, fsynced, closed, renamed over `path`. Errors
// name the file and carry strerror(errno); `path` is never half-written.
void write_file_atomic(const std::string& path, const std::string& content);

// XML 1.0 attribute/text escaping of sanitize_utf8(s) (touchstone/model/tokenizer.h:
// invalid UTF-8 -> U+FFFD): & < > " escaped, the
// characters XML 1.0 forbids (C0 controls but tab/LF/CR, U+FFFE, U+FFFF)
// written as the text "\xNN" / "\u{FFFE}".
std::string xml_escape(const std::string& s);

// sanitize_utf8(s) for the terminal: every control character (C0, DEL, C1)
// shown as a visible escape ("\n", "\r", "\t", "\x1b", "\u{9b}"), never
// interpreted, so a backend's string cannot start a line or move the cursor.
std::string terminal_text(const std::string& s);

}  // namespace touchstone
