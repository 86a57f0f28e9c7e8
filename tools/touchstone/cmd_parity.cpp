// touchstone parity [--backend NAME|PATH] [--suite quick|full|smoke] [--case C]... [--weights ...]
// The CLI over touchstone::ParityRun (touchstone/run/parity_run.h): its flags
// are ParityOptions; it shows progress on stderr, rewrites the JSON / JUnit /
// readable reports after every check, prints the report table and exits 0
// only when the harness judged every check PASS (or a reviewed KNOWN_DIVERGENCE).
#include <fmt/format.h>

#include <cstdio>

#include "cli_common.h"
#include "expect.h"
#include "parity_observer.h"
#include "touchstone/harness/serving.h"
#include "touchstone/harness/structured.h"
#include "touchstone/report/report.h"
#include "touchstone/run/parity_run.h"

namespace touchstone::cli {
namespace {

struct Opts : ParityOptions, ReportOutputs, ExpectOptions {
  Opts() { manifest = checking_manifest_path(); }
};

// The exit code of a finished report (with --expect-fail: expect.h).
int exit_code(const Opts& o, const Report& report) {
  const std::string verdict = report.verdict();
  if (verdict == "SKIP") return kExitSkip;
  if (verdict == "UNSUPPORTED") return kExitUnsupported;
  if (!o.expect_fail) return report.passed() ? 0 : kExitFail;
  return expect_exit_code(o, o.fault, report);
}

int run_parity(const Opts& o) {
  ParityRun run(o);
  CliObserver observer(o);
  const Report report = run.run(observer);
  fmt::print("{}", format_table(report));
  return exit_code(o, report);
}

// What runs: the backend, the cases and passages, the golden-free checks.
void add_selection_options(CLI::App* cmd, Opts* o) {
  cmd->add_option("--backend,-b", o->backend,
                  "Backend name (libtouchstone_backend_NAME.so), library path, \"exec:CMD ...\", "
                  "or http://HOST:PORT (a llama-server, docs/backends/http.md)");
  cmd->add_option(
      "--suite", o->suite,
      "Suite from the manifest: quick (default; trimmed) or full (every case, every step)");
  cmd->add_option("--model", o->model,
                  "Manifest model whose checks run (default: the model of the named cases, else "
                  "the manifest's first model)");
  cmd->add_option("--case", o->cases, "Only these cases (repeatable)");
  cmd->add_option("--skip-case", o->skip_cases,
                  "Leave these cases out (repeatable; the suite's trims still apply)");
  cmd->add_option("--scoring", o->scoring, "Only these scoring passages (repeatable)");
  cmd->add_option("--max-steps", o->max_steps,
                  "Compare only the first N greedy steps of each case (default: the suite's trim "
                  "when no --case is named, else every step)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-positions", o->max_positions,
                  "Score only the first N positions of each scoring passage (default: the suite's "
                  "trim when no --scoring is named, else every position)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--no-scoring", o->no_scoring, "Skip the teacher-forced scoring passages");
}

void add_check_options(CLI::App* cmd, Opts* o) {
  cmd->add_flag("--consistency", o->consistency,
                "Also run the golden-free consistency checks (prefill vs decode, chunked prefill, "
                "rewind + replay, thread counts, run to run; default when no --case/--scoring)");
  cmd->add_flag("--consistency-only", o->consistency_only, "Run only the consistency checks");
  cmd->add_flag("--no-consistency", o->no_consistency, "Leave the consistency checks out");
  cmd->add_option("--consistency-tokens", o->consistency_tokens,
                  "Tokens of the consistency checks' sequence (prompt + golden continuation; "
                  "default: the suite's consistency_tokens, else 96)")
      ->check(CLI::Range(2, 4096));
  cmd->add_flag("--serving", o->serving,
                "Also run the serving checks (batch invariance, content isolation, prefix fork, "
                "speculative verification; docs/serving-checks.md), emulating what the backend "
                "lacks (default when no --case/--scoring and the backend has step_batch or "
                "fork_session)");
  cmd->add_flag("--serving-only", o->serving_only, "Run only the serving checks");
  cmd->add_flag("--no-serving", o->no_serving, "Leave the serving checks out");
  cmd->add_option("--serving-check", o->serving_checks,
                  "Only this serving check (repeatable): serving.batch_invariance, "
                  "serving.content_isolation, serving.prefix_fork, serving.speculative_verify")
      ->check(CLI::IsMember(serving_check_names()));
  cmd->add_flag("--structured", o->structured,
                "Also run the structured-output checks on one grammar case (mask parity, "
                "constrained greedy, termination, non-interference, rollback, speculative "
                "drafts, batch isolation; docs/structured-output.md#checks)");
  cmd->add_flag("--structured-only", o->structured_only, "Run only the structured-output checks");
  cmd->add_option("--structured-check", o->structured_checks,
                  "Only this structured-output check (repeatable)")
      ->check(CLI::IsMember(structured_check_names()));
  cmd->add_option("--serving-plan", o->serving_plan,
                  "Sizes of the serving checks: smoke (B = 3; fillers of 10-16 tokens; K = 4), "
                  "quick (B = 2, 4; fillers of 10-32 tokens) or full (B = 2, 4, 8, 16; fillers "
                  "of 10-2048 tokens); default: the suite's serving_plan, else quick (full for "
                  "the full suite on a native batch)")
      ->check(CLI::IsMember({"smoke", "quick", "full"}));
}

// How the backend runs: weight path, profile, threads, time limit, process.
void add_run_options(CLI::App* cmd, Opts* o) {
  cmd->add_option("--weights", o->weights, "full_precision | quantized");
  cmd->add_option("--profile", o->profile,
                  "Tolerance profile (default: exact for full_precision, quantized otherwise)");
  cmd->add_option("--threads,-t", o->threads, "Threads (0 = backend default)")
      ->check(CLI::Range(0, 4096).description("an integer in [0, 4096]"));
  cmd->add_option("--timeout", o->timeout_s,
                  "Time limit per backend call in seconds (child process only; a prefill gets it "
                  "once per 1024 tokens); a call still running after it is a FAIL")
      ->check(finite_seconds());
  cmd->add_flag("--in-process", o->in_process,
                "Load the backend into the harness process (debugging): no time limit, and a "
                "crash takes the run down");
}

// A fleet: one shard of the plan, and the recorded durations that balance it.
void add_fleet_options(CLI::App* cmd, Opts* o) {
  cmd->add_option_function<std::string>(
      "--shard", [o](const std::string& s) { o->shard = parse_shard(s, process_environment()); },
      "Run one shard of the plan: I/N, or auto (auto/N) with the index from SLURM_ARRAY_TASK_ID, "
      "JOB_COMPLETION_INDEX or BUILDKITE_PARALLEL_JOB; --json writes what `touchstone merge` "
      "reads (docs/fleet.md)");
  cmd->add_option("--durations", o->durations,
                  "Recorded seconds per plan item (JSON): they balance the shards (every shard "
                  "reads the same file); an unsharded run writes its items' seconds back");
}

// Inputs (manifest, goldens, known divergences) and the reports written.
void add_io_options(CLI::App* cmd, Opts* o) {
  cmd->add_option("--known-divergences", o->known_divergences,
                  "Reviewed expected failures (JSON, docs/known-divergences.md; repeatable): a "
                  "failing check within an entry's accepted numbers is KNOWN_DIVERGENCE, not "
                  "FAIL; an entry whose item passes is a FAIL")
      ->check(CLI::ExistingFile);
  cmd->add_option("--json", o->json, "Write the report as JSON here (rewritten after every case)");
  cmd->add_option("--junit", o->junit, "Write the report as JUnit XML here");
  add_readable_options(*cmd, o->readable);
  cmd->add_option("--manifest", o->manifest, "goldens/manifest.json");
  cmd->add_option("--goldens", o->goldens,
                  "Directory of goldens recorded by `touchstone golden --cases` (its "
                  "manifest.json); instead of --manifest");
  cmd->add_flag("--trust-goldens", o->trust_goldens,
                "Read a golden whose sha256 does not match the manifest's pin, or that lacks its "
                "checksum header, and skip the stale-golden check (debugging only)");
}

}  // namespace

void add_parity(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("parity", "Compare a backend with the goldens");
  cmd->footer(kExitCodesHelp);
  add_selection_options(cmd, o.get());
  add_check_options(cmd, o.get());
  add_run_options(cmd, o.get());
  add_expect_options(cmd, o.get(), &o->fault);
  add_io_options(cmd, o.get());
  add_fleet_options(cmd, o.get());
  cmd->callback([o, &exit_code] { exit_code = run_parity(*o); });
}

}  // namespace touchstone::cli
