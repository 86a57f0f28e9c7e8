// parity_run.cpp - ParityRun::run: the backend started and described, then
// every planned group of checks (goldens, consistency, serving, structured)
// in order, the verdict order applied (docs/report-format.md#verdict-order).
#include <chrono>

#include "parity_internal.h"
#include "touchstone/harness/multimodal.h"
#include "touchstone/harness/serving.h"
#include "touchstone/report/report_merge.h"
#include "touchstone/run/backend_identity.h"
#include "touchstone/run/model_facts.h"
#include "touchstone/run/top_n_plan.h"

namespace touchstone {
namespace run_detail {
namespace {

// multimodal.serving (touchstone/harness/multimodal.h) on the first two image cases of
// the plan that share one prompt, where the backend takes input embeddings.
void run_multimodal_serving(const Inputs& in, BackendHost& host, const KnownDivergenceKey& key,
                            const ServingOptions& opt, Report& report) {
  const GoldenCase* a = nullptr;
  const GoldenCase* b = nullptr;
  for (const std::string& n : in.plan.all_cases) {
    const GoldenCase* g = in.golden.find_case(n);
    if (!g || !g->has_image()) continue;
    if (!a) {
      a = g;
    } else if (!b && g->prompt_ids == a->prompt_ids &&
               g->frame_positions() == a->frame_positions()) {
      b = g;
    }
  }
  if (!b || !opt.runs("serving.batch_invariance")) return;
  ++report.n_planned;
  if (!host.library().has_embeddings()) {
    report.not_supported.push_back(
        {"multimodal.serving",
         "image sequences need input embeddings (ABI v8 TS_CAP_EMBEDDING_INPUT)"});
    --report.n_planned;
    return;
  }
  report.cases.push_back(check_multimodal_serving(host.model(), *a, *b, *in.profile, opt));
  in.known.apply(key, report.cases.back());
}

}  // namespace

// Serving checks: asked for, or by default (no --case / --scoring) when the
// backend has a serving member of its own (ABI v6).
// A backend that cannot start (crash, protocol violation) has its failure in
// the rows already; with --serving / --serving-only run_serving records it.
// TS_ERR_DEVICE / TS_ERR_UNSUPPORTED follow the verdict order (backend_failure).
bool wants_serving(const Opts& o, BackendHost& host, Report& report) {
  if (o.no_serving || o.consistency_only || o.structured_only) return false;
  if (o.serving || o.serving_only) return true;
  if (!o.cases.empty() || !o.scoring.empty()) return false;
  try {
    BackendLibrary& lib = host.library();
    return lib.batch_mode() != BatchMode::kHarness || lib.has_fork();
  } catch (const BackendError& e) {
    CaseResult r = backend_failure<CaseResult>(host, report, "serving", e);
    if (skips_run(e)) report.cases.push_back(std::move(r));
    return false;
  }
}

namespace {

// The suite's plan, except that the full plan's long fillers exercise a native
// batch only: a looped or emulated batch runs them one at a time and gets the
// quick plan unless --serving-plan names one.
ServingPlan serving_plan(const Opts& o, const Inputs& in, BackendLibrary& lib) {
  if (!o.serving_plan.empty()) return ServingPlan::named(o.serving_plan);
  const Suite& suite = in.manifest.find_suite(o.suite);
  if (!suite.serving_plan.empty()) return ServingPlan::named(suite.serving_plan);
  const bool native = lib.batch_mode() == BatchMode::kNative;
  return o.suite == "full" && native ? ServingPlan::full() : ServingPlan::quick();
}

}  // namespace

namespace {

// A backend may hold a session to the model's trained context ({arch}.context_length,
// as llama.cpp does): a serving plan that needs more positions than that is NOT
// SUPPORTED there, with both numbers. Within the trained context, CONTEXT_FULL stays a
// failure. True when it recorded that.
bool serving_beyond_context(const Inputs& in, int32_t needed, const BackendError& e,
                            Report& report) {
  if (e.status() != TS_ERR_CONTEXT_FULL) return false;
  const std::optional<ModelConfig>& c = model_facts(in.model_path).config;
  if (!c || c->n_ctx_train <= 0 || needed <= c->n_ctx_train) return false;
  report.not_supported.push_back(
      {"serving", fmt::format("the serving plan needs {} positions, beyond the model's trained "
                              "context of {}, which the backend keeps to: {}",
                              needed, c->n_ctx_train, e.what())});
  return true;
}

}  // namespace

// The serving checks (touchstone/harness/serving.h) on the first case's prompt and
// golden continuation, as four more result rows; sessions sized for the plan.
void run_serving(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                 ParityObserver& obs) {
  const std::string& first = anchor_case(in);
  const GoldenCase& g = *in.golden.find_case(first);
  int32_t needed = 0;  // the plan's positions, once known
  int planned = 0;     // the rows it planned
  try {
    BackendLibrary& lib = host.library();
    const ServingPlan plan = serving_plan(o, in, lib);
    report.info.batching = batch_mode_name(lib.batch_mode());
    report.info.fork = lib.has_fork() ? "native" : "emulated by the harness";
    obs.note(fmt::format("serving checks on case '{}' (batching: {}; fork: {})", first,
                         report.info.batching, report.info.fork));
    const ts_capabilities caps = lib.capabilities();
    BackendSessionOptions so{in.weights, o.threads, planned_context(o, in), session_fault(o)};
    needed = int32_t(plan.context_needed(g.prompt_ids.size() + size_t(plan.decode_steps)));
    so.max_context = std::max(so.max_context, needed);
    ServingOptions opt = serving_options(caps, so, plan);
    opt.checks = o.serving_checks;
    // A failing batch or fork comparison names its first divergent layer
    // where the backend has taps and the profile a layer tolerance.
    if (const std::optional<double> tol = in.profile->layer_tolerance();
        lib.has_taps() && tol && g.tap_record_size() > 0) {
      opt.tap_floats = g.tap_record_size();
      opt.tap_dim = size_t(g.tap_dim);
      opt.layer_tolerance = *tol;
    }
    for (const GoldenCase& c : in.golden.cases) {  // text to extend the needle with
      if (c.name == first) continue;
      opt.extension.insert(opt.extension.end(), c.prompt_ids.begin(), c.prompt_ids.end());
      opt.extension.insert(opt.extension.end(), c.greedy_ids.begin(), c.greedy_ids.end());
    }
    const bool verify = opt.runs("serving.speculative_verify");
    planned = int(opt.n_checks()) - (verify && !opt.all_positions ? 1 : 0);
    report.n_planned += planned;
    if (verify && !opt.all_positions) {
      report.not_supported.push_back(
          {"serving.speculative_verify",
           "verification reads every position's logits: the backend lacks "
           "TS_CAP_ALL_POSITION_LOGITS"});
    }
    const KnownDivergenceKey key{report.info.backend, report.info.model_name,
                                 report.info.weight_path, report.info.profile};
    add_check_rows(in, key,
                   check_serving(host.model(), g.prompt_ids, g.greedy_ids, *in.profile, opt),
                   opt.no_rows_reason(), report);
    run_multimodal_serving(in, host, key, opt, report);
  } catch (const BackendError& e) {
    if (serving_beyond_context(in, needed, e, report)) {
      report.n_planned -= planned;
    } else {
      report.cases.push_back(backend_failure<CaseResult>(host, report, "serving", e));
    }
  }
  obs.report_updated(report);
}

}  // namespace run_detail

namespace {

using namespace run_detail;

// A top-N backend (a server): what it cannot support becomes NOT SUPPORTED
// rows, and its tokenizer is checked against the first case's golden ids.
void plan_top_n(const Opts& o, const Inputs& in, BackendHost& host, Report& report, int top_n,
                ParityObserver& obs) {
  report.not_supported =
      top_n_not_supported(top_n, o.consistency_only ? std::vector<std::string>{} : in.plan.scoring,
                          wants_consistency(o));
  report.n_planned = o.consistency_only ? 0 : int(in.plan.cases.size());
  if (!in.own_identity || (in.plan.all_cases.empty() && in.golden.cases.empty()))
    return obs.report_updated(report);
  const std::string& first = anchor_case(in);
  if (std::optional<CaseResult> id = check_remote_tokenizer(host, *in.golden.find_case(first))) {
    report.cases.push_back(std::move(*id));
    ++report.n_planned;
  }
  obs.report_updated(report);
}

// Identity of the backend for the report; a backend that cannot even start
// is named by its path and each check fails at setup.
void describe_backend(BackendHost& host, RunInfo& info) {
  try {
    BackendLibrary& lib = host.library();
    info.backend = lib.name();
    info.backend_path = lib.path();
    info.device = lib.device_name();
    info.backend_version = lib.version();
    info.backend_api_version = lib.api_version();
  } catch (const BackendCrash& e) {
    info.device = fmt::format("(backend failed to start: {})", e.what());
    return;
  }
  try {
    info.capabilities = describe_capabilities(host.library().capabilities());
  } catch (const std::exception&) {
    // A backend that cannot say: the checks that need the capabilities fail with the reason.
  }
}

// Seconds per plan item (shard.h) from the rows of a report.
std::map<std::string, double> item_seconds(const Report& report) {
  std::map<std::string, double> out;
  for (const CaseResult& c : report.cases)
    if (const std::string item = plan_item_of(c.name, false); !item.empty()) out[item] += c.seconds;
  for (const ScoringResult& s : report.scoring) out["scoring:" + s.name] += s.seconds;
  return out;
}

// The groups of checks in order; a BackendError that escapes one follows the
// verdict order (backend_failure).
void run_groups(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                ParityObserver& obs) {
  describe_backend(host, report.info);
  const int top_n = backend_top_n(host);
  if (top_n > 0) plan_top_n(o, in, host, report, top_n, obs);
  if (!o.consistency_only && !o.serving_only && !o.structured_only)
    run_checks(o, in, host, report, top_n == 0, obs);
  if (wants_consistency(o) && top_n == 0) run_consistency(o, in, host, report, obs);
  if (wants_serving(o, host, report)) run_serving(o, in, host, report, obs);
  // Top-N rows: only a backend that enforces grammars itself (its own picks).
  if (wants_structured(o) && (top_n == 0 || host.library().has_grammar())) {
    run_structured(o, in, host, report, obs);
  } else if (wants_structured(o)) {
    report.not_supported.push_back(
        {"structured", fmt::format("the harness applies a grammar to full logits rows; the "
                                   "backend returns only its top-{} log-probabilities and "
                                   "does not enforce grammars itself",
                                   top_n)});
  }
}

}  // namespace

ParityRun::ParityRun(ParityOptions options) : o_(std::move(options)) {
  using run_detail::load_inputs;
  const auto t0 = std::chrono::steady_clock::now();
  in_ = load_inputs(o_);
  in_->t0 = t0;
  in_->plan.all_cases = in_->plan.cases;
  in_->plan.all_scoring = in_->plan.scoring;
  in_->context = run_detail::planned_context(o_, *in_);
  run_detail::apply_shard(o_, *in_);
}

ParityRun::~ParityRun() = default;

const std::vector<std::string>& ParityRun::cases() const { return in_->plan.cases; }
const std::vector<std::string>& ParityRun::scoring() const { return in_->plan.scoring; }
const std::string& ParityRun::model_name() const { return in_->plan.model->name; }
const std::string& ParityRun::model_path() const { return in_->model_path; }
int ParityRun::case_max_steps() const {
  return run_detail::effective_max_steps(o_, in_->manifest.find_suite(o_.suite));
}
int ParityRun::passage_max_positions(const std::string& name) const {
  return run_detail::effective_max_positions(o_, in_->manifest.find_suite(o_.suite), name);
}
std::vector<PlanItem> ParityRun::plan_items() const { return run_detail::plan_items(o_, *in_); }
const std::optional<ShardInfo>& ParityRun::shard() const { return in_->shard; }
bool ParityRun::runs_consistency() const { return run_detail::wants_consistency(o_); }
bool ParityRun::runs_structured() const { return run_detail::wants_structured(o_); }

Report ParityRun::run(ParityObserver& obs) {
  using namespace run_detail;
  const Opts& o = o_;
  const Inputs& in = *in_;
  Report report;
  report.n_planned = o.consistency_only || o.serving_only || o.structured_only
                         ? 0
                         : int(in.plan.cases.size() + in.plan.scoring.size());
  if (wants_consistency(o)) report.n_planned += 5;
  report.info = run_info(o, in);
  report.shard = in.shard;
  BackendHost host(HostOptions{
      o.backend, o.in_process, o.timeout_s, in.model_path,
      BackendSessionOptions{in.weights, o.threads, planned_context(o, in), session_fault(o)},
      golden_n_vocab(in.golden), vision_fault(o)});
  report.info.execution = host.execution();
  obs.report_updated(report);  // an observer writing files checks its paths here
  if (o.in_process) arm_exit_guard(o.backend);
  try {
    run_groups(o, in, host, report, obs);
  } catch (const BackendError& e) {           // the verdict order, as in backend_failure
    if (skips_run(e) && !report.started()) {  // no device here, or this model / path refused
      (e.status() == TS_ERR_DEVICE ? report.skipped : report.unsupported) = e.what();
    } else {  // e.g. a backend that cannot describe itself: a FAIL naming the cause
      report.cases.push_back(backend_failure<CaseResult>(host, report, "backend", e));
    }
  }
  report.complete = true;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - in.t0).count();
  report.info.finished_at = utc_timestamp(std::chrono::system_clock::now());
  // A shard leaves the durations alone (the other shards split the plan by
  // them); `touchstone merge --durations` records a sharded run's.
  if (!o.durations.empty() && !o.shard.sharded())
    update_durations(o.durations, item_seconds(report));
  obs.report_updated(report);
  disarm_exit_guard();
  return report;
}

}  // namespace touchstone
