// parity_run.h - a whole parity run as a library call: plan it from a
// manifest and options, run it against a backend, observe its progress, get
// the report every renderer reads (touchstone/report/report.h).
//
//   touchstone::ParityOptions o;
//   o.manifest = "goldens/manifest.json";
//   o.backend = "cpu_simd";
//   o.weights = "quantized";
//   touchstone::ParityRun run(o);               // reads manifest, goldens, tokenizer
//   touchstone::Report r = run.run(observer);   // r.verdict(): PASS / FAIL / ...
//
// `touchstone parity` is this call plus argument parsing and printing; its
// flags map one to one onto ParityOptions (`touchstone parity --help`;
// docs/sdk.md#googletest).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "touchstone/report/report.h"
#include "touchstone/run/shard.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

// What a run checks and how. Defaults are `touchstone parity`'s.
struct ParityOptions {
  // Inputs: the manifest (goldens/manifest.json), or a directory of goldens
  // recorded by `touchstone golden --cases` (its manifest.json; wins when set).
  std::string manifest = "goldens/manifest.json";
  std::string goldens;
  // Read a golden whose sha256 differs from the manifest's pin and skip the
  // stale-golden check (debugging only).
  bool trust_goldens = false;
  // Reviewed expected failures (JSON files, docs/known-divergences.md).
  std::vector<std::string> known_divergences;

  // The backend: a name (libtouchstone_backend_NAME.so), a library path,
  // "exec:CMD ..." or http://HOST:PORT.
  std::string backend = "reference";
  bool in_process = false;   // load it into this process (no time limit)
  double timeout_s = 300.0;  // per backend call (child process; per 1024 tokens of a prefill)
  std::string weights = "full_precision";  // full_precision | quantized
  std::string profile;                     // "" = exact (full_precision) / quantized
  int threads = 0;                         // 0 = the backend's default
  std::string fault;                       // test only: a named fault (faults.h)

  // Selection: the suite (quick | full | smoke), its model, cases, passages.
  std::string suite = "quick";
  std::string model;  // "" = the named cases' model, else the manifest's first
  std::vector<std::string> cases, scoring, skip_cases;
  bool no_scoring = false;
  int max_steps = 0;      // 0 = the suite's trim when no case is named, else all
  int max_positions = 0;  // 0 = the suite's trim when no passage is named, else all

  // Golden-free consistency checks (touchstone/harness/consistency.h):
  // default on when no case / passage is named.
  bool consistency = false, consistency_only = false, no_consistency = false;
  int consistency_tokens = 0;  // 0 = the suite's, else 96
  // Serving checks (touchstone/harness/serving.h): default on, when no case /
  // passage is named, for a backend with step_batch or fork_session.
  bool serving = false, serving_only = false, no_serving = false;
  std::string serving_plan;                 // smoke | quick | full; "" = the suite's
  std::vector<std::string> serving_checks;  // empty = all
  // Structured-output checks (touchstone/harness/structured.h) on one grammar case.
  bool structured = false, structured_only = false;
  std::vector<std::string> structured_checks;  // empty = all

  // Fleet (touchstone/run/shard.h, docs/fleet.md): run only this shard's items
  // of the plan (the report then carries a ShardInfo for `touchstone merge`).
  ShardSpec shard;
  // Recorded seconds per plan item (read_durations): they balance the shards
  // (every shard of a plan must read the same file); an unsharded run writes
  // its items' seconds back (`touchstone merge --durations` for a sharded one).
  // "" = none.
  std::string durations;
};

// Progress of a run, as it happens. Every member has an empty default; the
// calls come from the thread that called ParityRun::run, in this order:
// planned, then per check check_started / check_progress* / check_finished,
// note at each group of golden-free checks, report_updated after every row
// and once at the end (then report.complete is true).
class ParityObserver {
 public:
  virtual ~ParityObserver() = default;
  // The checks against goldens: how many, and their work in units (prompt
  // tokens + greedy steps of the cases, positions of the passages).
  virtual void planned(size_t /*n_checks*/, double /*units*/) {}
  virtual void check_started(const std::string& /*name*/, double /*units*/) {}
  // Within the running check: `done` of `total` steps or positions.
  virtual void check_progress(int /*done*/, int /*total*/) {}
  virtual void check_finished(bool /*acceptable*/, double /*seconds*/, double /*units*/) {}
  // A line saying what runs next ("consistency checks on case 'narrative' (96 tokens)").
  virtual void note(const std::string& /*line*/) {}
  // The report as it stands (write it out here to have it after a crash).
  virtual void report_updated(const Report& /*report*/) {}
};

struct ParityInputs;  // manifest, plan, goldens, tokenizer (parity_run.cpp)

class ParityRun {
 public:
  // Reads and checks everything a run needs before it touches the backend:
  // the manifest, the plan (cases, passages, model), the golden (sha256 pin,
  // stale-golden check), the model's tokenizer, the known divergences.
  // Throws touchstone::Error naming the file and field at fault.
  explicit ParityRun(ParityOptions options);
  ~ParityRun();
  ParityRun(const ParityRun&) = delete;
  ParityRun& operator=(const ParityRun&) = delete;

  // The options as planned: for a shard, the groups of golden-free checks it
  // does not own are switched off (no_consistency, no_serving, structured).
  const ParityOptions& options() const { return o_; }
  // Every item of the plan, in run order, with its cost (shard.h), and this
  // run's shard of it (empty when not sharded).
  std::vector<PlanItem> plan_items() const;
  const std::optional<ShardInfo>& shard() const;
  // The planned checks against goldens, in run order.
  const std::vector<std::string>& cases() const;
  const std::vector<std::string>& scoring() const;
  const std::string& model_name() const;
  const std::string& model_path() const;
  // The trims this run applies: greedy steps per case (0 = every step) and
  // positions of passage `name` (0 = every position). A run of one named case
  // or passage with these trims checks what the whole suite's run checks.
  int case_max_steps() const;
  int passage_max_positions(const std::string& name) const;
  // Whether the run includes the consistency / structured-output groups.
  bool runs_consistency() const;
  bool runs_structured() const;

  // Runs every planned check (a backend failure is a FAIL row and the next
  // check gets a fresh session; no device / a refused model or weight path
  // before any check ran makes the report SKIP / UNSUPPORTED). Call once.
  Report run(ParityObserver& observer);

 private:
  ParityOptions o_;
  std::unique_ptr<ParityInputs> in_;
};

// "full_precision" (or "fp32") / "quantized"; anything else throws
// touchstone::Error naming the value.
ts_weight_path parse_weight_path(const std::string& s);
const char* weight_path_name(ts_weight_path w);

}  // namespace touchstone
