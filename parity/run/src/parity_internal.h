// parity_internal.h - what the parity run's source files share (not installed).
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "touchstone/golden/golden.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/harness/known_divergence.h"
#include "touchstone/harness/parity.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/model/tokenizer.h"
#include "touchstone/report/report.h"
#include "touchstone/run/backend_host.h"
#include "touchstone/run/parity_run.h"
#include "touchstone/run/shard.h"

namespace touchstone {

using Opts = ParityOptions;

struct Plan {
  std::vector<std::string> cases, scoring;  // this run's (one shard's when sharded)
  // The whole plan's: the anchor case of the golden-free checks is its first
  // case, so every shard checks what the unsharded run checks.
  std::vector<std::string> all_cases, all_scoring;
  const ManifestModel* model = nullptr;
};

// A mixture-of-experts model's weights for the routing diagnosis (parity_routing.cpp),
// read on the first FFN divergence; weights empty for a dense model.
struct MoeProbe {
  std::optional<StoredWeights> weights;
};

// Everything a run reads before it touches the backend.
struct ParityInputs {
  Manifest manifest;
  Plan plan;
  const Profile* profile = nullptr;
  ts_weight_path weights = TS_WEIGHTS_FULL_PRECISION;
  std::string model_path;
  GoldenFile golden;
  std::unique_ptr<Tokenizer> tok;
  KnownDivergences known;                       // reviewed expected failures (--known-divergences)
  int32_t context = 0;                          // every session's KV capacity (the whole plan's)
  std::optional<ShardInfo> shard;               // set when the run is one shard
  bool own_identity = true;                     // a top-N backend's tokenizer check runs here
  std::chrono::steady_clock::time_point t0;     // the run's start (before the inputs were read)
  mutable std::shared_ptr<MoeProbe> moe_probe;  // null until a diagnosis needs it
};
using Inputs = ParityInputs;

// When case r's first divergent layer tap is an FFN output of a mixture-of-experts
// model: the routing diagnosis (touchstone/run/moe_routing.h) as the divergence's
// explanation, and a failure when the backend's routing or weighting differs beyond
// the near-tie rule (docs/metrics.md, "Routing divergence").
void explain_routing(const Inputs& in, const GoldenCase& g, CaseResult& r);

namespace run_detail {

std::unique_ptr<Inputs> load_inputs(const Opts& o);
int32_t golden_n_vocab(const GoldenFile& g);
int effective_max_steps(const Opts& o, const Suite& suite);
int effective_max_positions(const Opts& o, const Suite& suite, const std::string& name);
int consistency_tokens(const Opts& o, const Suite& suite);
bool wants_consistency(const Opts& o);
bool wants_structured(const Opts& o);
int32_t planned_context(const Opts& o, const Inputs& in);
// --fault split by where it goes: a vision-path fault (Faults::vision_path) to the model's
// vision path (ABI v9 set_vision_options), any other to every session; "" elsewhere.
std::string session_fault(const Opts& o);
std::string vision_fault(const Opts& o);
RunInfo run_info(const Opts& o, const Inputs& in);

void run_checks(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                bool with_scoring, ParityObserver& obs);
void run_consistency(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                     ParityObserver& obs);
void add_check_rows(const Inputs& in, const KnownDivergenceKey& key, std::vector<CaseResult> rows,
                    const std::string& no_rows, Report& report, const std::string& case_name = "");
void run_structured(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                    ParityObserver& obs);
bool wants_serving(const Opts& o, BackendHost& host, Report& report);
void run_serving(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                 ParityObserver& obs);
// Work units (progress, shard balance): a case's prompt tokens + greedy steps
// (trimmed), a passage's positions (trimmed).
double case_units(const Opts& o, const Inputs& in, const std::string& name);
double scoring_units(const Opts& o, const Inputs& in, const std::string& name);
// The anchor case of the consistency and serving checks.
const std::string& anchor_case(const Inputs& in);
// The plan's items (touchstone/run/shard.h) and, when o.shard is set, this
// shard's: in.plan narrowed, the groups it does not own switched off in o.
std::vector<PlanItem> plan_items(const Opts& o, const Inputs& in);
void apply_shard(Opts& o, Inputs& in);

// A failure the backend caused before the check could start (load, session).
template <typename Result>
Result setup_failure(const std::string& name, const std::exception& e) {
  Result r;
  r.name = name;
  r.backend_error = fmt::format("setup: {}", e.what());
  r.failures.push_back(r.backend_error);
  return r;
}

// A backend failure while check `name` starts or runs: its FAIL row, the
// session replaced for the next check. The verdict order
// (docs/report-format.md#verdict-order): TS_ERR_DEVICE / TS_ERR_UNSUPPORTED
// before the first check ran are rethrown (run_parity: the run is SKIP /
// UNSUPPORTED); after it, they are a FAIL row like any other failure.
inline bool skips_run(const BackendError& e) {
  return e.status() == TS_ERR_DEVICE || e.status() == TS_ERR_UNSUPPORTED;
}

template <typename Result>
Result backend_failure(BackendHost& host, const Report& report, const std::string& name,
                       const BackendError& e) {
  const bool stop = skips_run(e);
  if (stop && !report.started()) throw;  // called inside the handler of `e`
  host.discard();
  if (!stop) return setup_failure<Result>(name, e);
  Result r;
  r.name = name;
  r.backend_error =
      fmt::format("{} after checks had run (a FAIL, not {}): {}", status_name(e.status()),
                  e.status() == TS_ERR_DEVICE ? "SKIP" : "UNSUPPORTED", e.what());
  r.failures.push_back(r.backend_error);
  return r;
}

// Runs `check` on a fresh or reused session; a backend failure at setup
// becomes the check's row (backend_failure), and a failure inside the check
// replaces the session for the next one.
template <typename Result, typename Fn>
Result guarded(BackendHost& host, const Report& report, const std::string& name, Fn&& check) {
  BackendSession* session = nullptr;
  try {
    session = &host.session();
  } catch (const BackendError& e) {
    return backend_failure<Result>(host, report, name, e);
  }
  Result r = check(*session);
  if (!r.backend_error.empty()) host.discard();
  return r;
}

}  // namespace run_detail
}  // namespace touchstone
