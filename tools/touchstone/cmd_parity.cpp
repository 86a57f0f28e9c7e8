// touchstone parity [--backend NAME|PATH] [--suite quick|full|smoke] [--case C]... [--weights ...]
// Runs the backend (in a child process unless --in-process) on every case of
// the suite, rewrites the JSON / JUnit reports after every case, prints the
// report table, exits 0 only when the harness itself judged every check PASS.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "backend_host.h"
#include "backend_identity.h"
#include "build_info.h"
#include "cli_common.h"
#include "expect.h"
#include "progress.h"
#include "readable_reports.h"
#include "top_n_plan.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"
#include "touchstone/harness/consistency.h"
#include "touchstone/harness/known_divergence.h"
#include "touchstone/harness/model_store.h"
#include "touchstone/harness/parity.h"
#include "touchstone/harness/serving.h"
#include "touchstone/harness/stale.h"
#include "touchstone/harness/structured.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/report/report.h"
#include "touchstone/report/report_view.h"
#include "touchstone/runtime/backend.h"

namespace touchstone::cli {
namespace {

struct Opts {
  std::string manifest = checking_manifest_path(), backend = "reference", suite = "quick";
  std::string weights = "full_precision", profile, fault, json, junit, model, goldens;
  std::string expect_step;   // --expect-step: N, CHECK or CHECK@N
  std::string expect_layer;  // --expect-layer: L:attn|ffn|resid, or after
  std::vector<std::string> cases, scoring;
  std::vector<std::string> skip_cases;         // --skip-case: left out of the selection
  std::vector<std::string> known_divergences;  // --known-divergences files
  bool no_scoring = false, expect_fail = false, in_process = false, trust_goldens = false;
  bool consistency = false, consistency_only = false, no_consistency = false;
  int consistency_tokens = 0;  // 0: the suite's, else 96
  // Serving checks (touchstone/harness/serving.h): on by default for a backend with
  // step_batch or fork_session; --serving runs them (emulated) for any backend.
  bool serving = false, serving_only = false, no_serving = false;
  std::string serving_plan;  // smoke | quick | full; "" = the suite's (serving_plan())
  std::vector<std::string> serving_checks;  // --serving-check (empty = all four)
  // Structured-output checks (touchstone/harness/structured.h) on one grammar case.
  bool structured = false, structured_only = false;
  std::vector<std::string> structured_checks;  // --structured-check (empty = all seven)
  int threads = 0, max_steps = 0, max_positions = 0;
  double timeout = 300.0;
  ReadableOutputs readable;  // --html, --summary
};

struct Plan {
  std::vector<std::string> cases, scoring;
  const ManifestModel* model = nullptr;
};

Plan plan_run(const Manifest& m, const Opts& o) {
  const Suite& suite = m.find_suite(o.suite);
  Plan p{o.cases.empty() ? suite.cases : o.cases, o.scoring.empty() ? suite.scoring : o.scoring};
  if (o.no_scoring) p.scoring.clear();
  // Naming cases or passages selects just those; naming neither runs the whole suite.
  if (!o.cases.empty() && o.scoring.empty()) p.scoring.clear();
  if (o.cases.empty() && !o.scoring.empty()) p.cases.clear();
  for (const std::string& n : o.skip_cases) {
    m.find_case(n);  // an unknown name is an error, not a silent no-op
    std::erase(p.cases, n);
  }
  // All checks of a run use one model: --model, else the model of the named cases,
  // else the manifest's first model. A suite's checks of other models are left out.
  std::string model_name = o.model;
  if (model_name.empty()) {
    for (const auto& n : o.cases) model_name = m.find_case(n).model;
    for (const auto& n : o.scoring) model_name = m.find_scoring(n).model;
  }
  if (model_name.empty() && !m.models.empty()) model_name = m.models.front().name;
  p.model = &m.find_model(model_name);
  auto keep = [&](std::vector<std::string>& names, bool named, auto model_of, const char* what) {
    std::vector<std::string> kept;
    for (const auto& n : names) {
      if (model_of(n) == model_name)
        kept.push_back(n);
      else if (named)
        throw Error("{} '{}' uses model '{}', not '{}'", what, n, model_of(n), model_name);
    }
    names = std::move(kept);
  };
  keep(
      p.cases, !o.cases.empty(), [&](const std::string& n) { return m.find_case(n).model; },
      "case");
  keep(
      p.scoring, !o.scoring.empty(), [&](const std::string& n) { return m.find_scoring(n).model; },
      "scoring passage");
  if (p.cases.empty() && p.scoring.empty()) {
    throw Error("nothing to run: suite '{}' has no cases or passages for model '{}'", o.suite,
                model_name);
  }
  return p;
}

// The reports as they stand, rewritten atomically (after every check). The
// HTML and Markdown are rendered from the JSON, as `touchstone summary` does.
void write_reports(const Opts& o, const Report& r) {
  if (o.json.empty() && !o.readable.any() && o.junit.empty()) return;
  const std::string json = to_json(r);
  if (!o.json.empty()) write_file_atomic(o.json, json);
  if (!o.junit.empty()) write_file_atomic(o.junit, to_junit(r));
  if (o.readable.any())
    write_readable_reports(o.readable, {parse_report_view(json, o.json.empty() ? "" : o.json)});
}

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
bool skips_run(const BackendError& e) {
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

// The vocabulary size the reference recorded: every backend must match it.
int32_t golden_n_vocab(const GoldenFile& g) {
  if (!g.cases.empty()) return g.cases.front().n_vocab;
  return g.scoring.empty() ? 0 : g.scoring.front().n_vocab;
}

// Everything a run reads before it touches the backend.
struct Inputs {
  Manifest manifest;
  Plan plan;
  const Profile* profile = nullptr;
  ts_weight_path weights = TS_WEIGHTS_FULL_PRECISION;
  std::string model_path;
  GoldenFile golden;
  std::unique_ptr<Tokenizer> tok;
  KnownDivergences known;  // reviewed expected failures (--known-divergences)
};

std::unique_ptr<Inputs> load_inputs(const Opts& o) {
  auto in = std::make_unique<Inputs>();
  in->manifest = load_manifest(o.goldens.empty() ? o.manifest : o.goldens + "/manifest.json");
  const Manifest& m = in->manifest;
  in->plan = plan_run(m, o);
  const ManifestModel& mm = *in->plan.model;
  in->weights = parse_weight_path(o.weights);
  in->profile = &m.find_profile(!o.profile.empty()                    ? o.profile
                                : in->weights == TS_WEIGHTS_QUANTIZED ? "quantized"
                                                                      : "exact");
  in->model_path = resolve_model(mm);
  // The golden's own sha256 is checked against the manifest's pin before
  // libhdf5 reads a byte; then it must answer what the manifest asks now.
  in->golden = read_pinned_golden(m, mm, o.trust_goldens);
  if (!o.trust_goldens) {
    // Only what this run reads: its cases and passages, and the model's first
    // case (the consistency and serving checks' needle when none is named).
    std::vector<std::string> used = in->plan.cases;
    used.insert(used.end(), in->plan.scoring.begin(), in->plan.scoring.end());
    for (const ManifestCase& c : m.cases) {
      if (c.model == mm.name) {
        used.push_back(c.name);
        break;
      }
    }
    require_fresh_golden(m, mm, in->golden,
                         chat_template_from_gguf(gguf::File::open(in->model_path)), &used);
  }
  in->tok = std::make_unique<Tokenizer>(load_tokenizer(in->model_path));
  for (const std::string& f : o.known_divergences) in->known.load(f);
  for (const auto& n : in->plan.cases)
    if (!in->golden.find_case(n))
      throw Error("{}: no golden for case '{}' (run `touchstone golden`)", m.resolve(mm.golden), n);
  for (const auto& n : in->plan.scoring)
    if (!in->golden.find_scoring(n))
      throw Error("{}: no golden for scoring passage '{}'", m.resolve(mm.golden), n);
  return in;
}

// The suite's trims apply unless cases / passages were named (--max-steps wins).
int effective_max_steps(const Opts& o, const Suite& suite) {
  return o.max_steps > 0 ? o.max_steps : o.cases.empty() ? suite.max_steps : 0;
}
// Of passage `name`: the suite's per-passage trim, else its max_positions.
int effective_max_positions(const Opts& o, const Suite& suite, const std::string& name) {
  return o.max_positions > 0 ? o.max_positions : o.scoring.empty() ? suite.positions_of(name) : 0;
}
// --consistency-tokens, else the suite's, else 96.
int consistency_tokens(const Opts& o, const Suite& suite) {
  if (o.consistency_tokens > 0) return o.consistency_tokens;
  return suite.consistency_tokens > 0 ? suite.consistency_tokens : 96;
}

bool wants_consistency(const Opts& o);

// KV capacity (max_context) every session of the run is opened with: the most
// positions any planned check uses, rounded up to a multiple of 1024. A
// backend's own default (max_context = 0) may be smaller than the 4,096-token
// long-context items need (static_graph's is 2048).
int32_t planned_context(const Opts& o, const Inputs& in) {
  const Suite& suite = in.manifest.find_suite(o.suite);
  const int max_steps = effective_max_steps(o, suite);
  size_t need = 0;
  if (!o.consistency_only) {
    for (const auto& n : in.plan.cases) {
      const GoldenCase& g = *in.golden.find_case(n);
      size_t steps = g.greedy_ids.size();
      if (max_steps > 0) steps = std::min(steps, size_t(max_steps));
      need = std::max(need, g.prompt_ids.size() + steps);
    }
    for (const auto& n : in.plan.scoring) {
      size_t pos = in.golden.find_scoring(n)->token_ids.size();
      const int max_positions = effective_max_positions(o, suite, n);
      if (max_positions > 0) pos = std::min(pos, size_t(max_positions) + 1);
      need = std::max(need, pos);
    }
  }
  if (wants_consistency(o)) need = std::max(need, size_t(consistency_tokens(o, suite)));
  constexpr size_t kRound = 1024;
  return int32_t((need + kRound - 1) / kRound * kRound);
}

// Every check of the plan, in order; reports rewritten after each.
// with_scoring = false: a top-N backend, whose passages are NOT SUPPORTED rows.
void run_checks(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                bool with_scoring) {
  const Suite& suite = in.manifest.find_suite(o.suite);
  const int max_steps = effective_max_steps(o, suite);
  // Progress units: prompt tokens + steps (prefill costs per token too), positions.
  auto case_units = [&](const std::string& n) {
    const GoldenCase& g = *in.golden.find_case(n);
    const double steps = double(g.greedy_ids.size());
    return double(g.prompt_ids.size()) +
           (max_steps > 0 ? std::min(steps, double(max_steps)) : steps);
  };
  auto scoring_units = [&](const std::string& n) {
    const double pos = double(in.golden.find_scoring(n)->token_ids.size());
    const int max_positions = effective_max_positions(o, suite, n);
    return max_positions > 0 ? std::min(pos, double(max_positions)) : pos;
  };
  double units = 0;
  for (const auto& n : in.plan.cases) units += case_units(n);
  for (const auto& n : in.plan.scoring) units += scoring_units(n);
  Progress progress(size_t(report.n_planned), units, Progress::stderr_is_tty());
  const KnownDivergenceKey key{report.info.backend, report.info.model_name, report.info.weight_path,
                               report.info.profile};
  const ProgressFn on_step = [&](int done, int total) { progress.step(done, total); };
  for (const std::string& n : in.plan.cases) {
    if (!with_scoring && in.golden.find_case(n)->has_grammar()) {  // a top-N backend
      report.not_supported.push_back(
          {n,
           "a structured-output case masks every step's full logits row with the grammar's "
           "allowed set; the backend returns only its top-N log-probabilities"});
      --report.n_planned;
      continue;
    }
    progress.start(n, case_units(n));
    report.cases.push_back(guarded<CaseResult>(host, report, n, [&](BackendSession& s) {
      return check_case(s, *in.tok, *in.golden.find_case(n), *in.profile, max_steps, on_step);
    }));
    in.known.apply(key, report.cases.back());
    const CaseResult& r = report.cases.back();
    progress.done(r.acceptable(), r.seconds,
                  double(in.golden.find_case(n)->prompt_ids.size()) + r.n_total);
    write_reports(o, report);
  }
  for (const std::string& n : with_scoring ? in.plan.scoring : std::vector<std::string>{}) {
    progress.start(n, scoring_units(n));
    report.scoring.push_back(guarded<ScoringResult>(host, report, n, [&](BackendSession& s) {
      bool all = false;
      try {
        all = (host.library().capabilities().flags & TS_CAP_ALL_POSITION_LOGITS) != 0;
      } catch (const BackendError& e) {
        return setup_failure<ScoringResult>(n, e);
      }
      return check_scoring(s, *in.golden.find_scoring(n), *in.profile, all,
                           effective_max_positions(o, suite, n), on_step);
    }));
    in.known.apply(key, report.scoring.back());
    const ScoringResult& r = report.scoring.back();
    progress.done(r.acceptable(), r.seconds, double(r.stats.n_positions));
    write_reports(o, report);
  }
}

// The golden-free checks (touchstone/harness/consistency.h) on the first case's prompt and
// golden continuation (at most --consistency-tokens, else the suite's
// consistency_tokens, else 96), as five more result rows.
void run_consistency(const Opts& o, const Inputs& in, BackendHost& host, Report& report) {
  const std::string& first =
      in.plan.cases.empty() ? in.golden.cases.front().name : in.plan.cases.front();
  const GoldenCase& g = *in.golden.find_case(first);
  std::vector<int32_t> tokens = g.prompt_ids;
  tokens.insert(tokens.end(), g.greedy_ids.begin(), g.greedy_ids.end());
  const int n_tokens = consistency_tokens(o, in.manifest.find_suite(o.suite));
  tokens.resize(std::min<size_t>(tokens.size(), size_t(n_tokens)));
  fmt::print(stderr, "  consistency checks on case '{}' ({} tokens)\n", first, tokens.size());
  try {
    const ts_capabilities caps = host.library().capabilities();
    ConsistencyOptions co{
        BackendSessionOptions{in.weights, o.threads, planned_context(o, in), o.fault},
        (caps.flags & TS_CAP_BITWISE_DETERMINISM) != 0,
        (caps.flags & TS_CAP_ALL_POSITION_LOGITS) != 0,
        {}};
    for (int32_t i = 0; i < std::clamp(caps.n_shape_buckets, 0, 16); ++i)
      co.buckets.push_back(caps.shape_buckets[i]);
    for (CaseResult& r : check_consistency(host.model(), tokens, *in.profile, co))
      report.cases.push_back(std::move(r));
  } catch (const BackendError& e) {
    report.cases.push_back(backend_failure<CaseResult>(host, report, "consistency", e));
  }
  write_reports(o, report);
}

// The rows of golden-free checks into the report: a row that compared nothing
// is NOT SUPPORTED (its own reason, else `no_rows`), never a PASS; the others
// go through the reviewed known divergences (item: the check's name, e.g.
// serving.prefix_fork, structured.mask_parity).
void add_check_rows(const Inputs& in, const KnownDivergenceKey& key, std::vector<CaseResult> rows,
                    const std::string& no_rows, Report& report, const std::string& case_name = "") {
  for (CaseResult& r : rows) {
    if (r.n_total == 0 && r.failures.empty()) {
      report.not_supported.push_back(
          {r.name, r.not_supported.empty() ? no_rows : r.not_supported.front()});
      --report.n_planned;
      continue;
    }
    if (case_name.empty()) {
      in.known.apply(key, r);
    } else {
      in.known.apply(key, r, case_name);
    }
    report.cases.push_back(std::move(r));
  }
}

bool wants_structured(const Opts& o) {
  return o.structured || o.structured_only || !o.structured_checks.empty();
}

// The structured checks on one grammar case: the first named case with a
// grammar, else the model's first grammar case in the golden.
// The grammar case of the structured checks: the first --case with a grammar;
// else, for a backend that enforces grammars, the first of the plan's and then
// the golden's grammar cases whose kind it takes (llama.cpp's sampler: GBNF),
// so its own enforcement is what the checks judge; else the first of them.
const GoldenCase* structured_case(const Opts& o, const Inputs& in, BackendHost& host) {
  std::vector<const GoldenCase*> cases;
  for (const std::string& n : in.plan.cases)
    if (const GoldenCase* c = in.golden.find_case(n); c && c->has_grammar()) cases.push_back(c);
  if (!o.cases.empty() && !cases.empty()) return cases.front();
  for (const GoldenCase& c : in.golden.cases)
    if (c.has_grammar()) cases.push_back(&c);
  if (cases.empty()) return nullptr;
  if (host.library().has_grammar()) {
    for (const GoldenCase* c : cases) {
      BackendSession probe(host.model(), BackendSessionOptions{in.weights, 1, 0, o.fault});
      if (enforce_grammar(probe, *c) == kGrammarByBackend) return c;
    }
  }
  return cases.front();
}

void run_structured(const Opts& o, const Inputs& in, BackendHost& host, Report& report) {
  const GoldenCase* g = structured_case(o, in, host);
  if (!g) {
    report.not_supported.push_back(
        {"structured", fmt::format("model '{}' has no grammar case", in.plan.model->name)});
    return write_reports(o, report);
  }
  StructuredOptions opt;
  opt.session = BackendSessionOptions{in.weights, o.threads, planned_context(o, in), o.fault};
  opt.checks = o.structured_checks;
  if (o.max_steps > 0) opt.max_steps = o.max_steps;
  opt.session.max_context = std::max<int32_t>(
      opt.session.max_context, int32_t(g->prompt_ids.size()) + opt.max_steps + opt.draft_length);
  fmt::print(stderr, "  structured checks on case '{}' (the backend {} grammars)\n", g->name,
             host.library().has_grammar() ? "enforces" : "enforces no");
  report.n_planned += int(opt.checks.empty() ? structured_check_names().size() : opt.checks.size());
  const KnownDivergenceKey key{report.info.backend, report.info.model_name, report.info.weight_path,
                               report.info.profile};
  try {
    add_check_rows(in, key, check_structured(host.model(), *in.tok, *g, *in.profile, opt),
                   "nothing to compare", report, g->name);
  } catch (const BackendError& e) {
    report.cases.push_back(backend_failure<CaseResult>(host, report, "structured", e));
  }
  write_reports(o, report);
}

bool wants_consistency(const Opts& o) {
  if (o.no_consistency || o.serving_only || o.structured_only) return false;
  return o.consistency || o.consistency_only || (o.cases.empty() && o.scoring.empty());
}

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

// The serving checks (touchstone/harness/serving.h) on the first case's prompt and
// golden continuation, as four more result rows; sessions sized for the plan.
void run_serving(const Opts& o, const Inputs& in, BackendHost& host, Report& report) {
  const std::string& first =
      in.plan.cases.empty() ? in.golden.cases.front().name : in.plan.cases.front();
  const GoldenCase& g = *in.golden.find_case(first);
  try {
    BackendLibrary& lib = host.library();
    const ServingPlan plan = serving_plan(o, in, lib);
    report.info.batching = batch_mode_name(lib.batch_mode());
    report.info.fork = lib.has_fork() ? "native" : "emulated by the harness";
    fmt::print(stderr, "  serving checks on case '{}' (batching: {}; fork: {})\n", first,
               report.info.batching, report.info.fork);
    const ts_capabilities caps = lib.capabilities();
    BackendSessionOptions so{in.weights, o.threads, planned_context(o, in), o.fault};
    so.max_context = std::max(so.max_context,
                              plan.context_needed(g.prompt_ids.size() + size_t(plan.decode_steps)));
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
    report.n_planned += int(opt.n_checks()) - (verify && !opt.all_positions ? 1 : 0);
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
  } catch (const BackendError& e) {
    report.cases.push_back(backend_failure<CaseResult>(host, report, "serving", e));
  }
  write_reports(o, report);
}

// A top-N backend (a server): what it cannot support becomes NOT SUPPORTED
// rows, and its tokenizer is checked against the first case's golden ids.
void plan_top_n(const Opts& o, const Inputs& in, BackendHost& host, Report& report, int top_n) {
  report.not_supported =
      top_n_not_supported(top_n, o.consistency_only ? std::vector<std::string>{} : in.plan.scoring,
                          wants_consistency(o));
  report.n_planned = o.consistency_only ? 0 : int(in.plan.cases.size());
  if (in.plan.cases.empty() && in.golden.cases.empty()) return write_reports(o, report);
  const std::string& first =
      in.plan.cases.empty() ? in.golden.cases.front().name : in.plan.cases.front();
  if (std::optional<CaseResult> id = check_remote_tokenizer(host, *in.golden.find_case(first))) {
    report.cases.push_back(std::move(*id));
    ++report.n_planned;
  }
  write_reports(o, report);
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

// What the report says about the run before any backend call.
RunInfo run_info(const Opts& o, const Inputs& in) {
  const ManifestModel& mm = *in.plan.model;
  RunInfo i;
  i.backend = i.backend_path = o.backend;
  i.weight_path = weight_path_name(in.weights);
  i.profile = in.profile->name;
  i.tolerances = *in.profile;
  i.suite = o.suite;
  i.model_name = mm.name;
  i.model_sha256 = mm.sha256;
  i.model_file = std::filesystem::path(in.model_path).filename().string();
  i.n_threads = o.threads;
  i.touchstone_version = touchstone_version();
  i.touchstone_revision = touchstone_revision();
  i.started_at = utc_timestamp(std::chrono::system_clock::now());
  return i;
}

int run_parity(const Opts& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::unique_ptr<Inputs> in = load_inputs(o);
  Report report;
  report.n_planned = o.consistency_only || o.serving_only || o.structured_only
                         ? 0
                         : int(in->plan.cases.size() + in->plan.scoring.size());
  if (wants_consistency(o)) report.n_planned += 5;
  report.info = run_info(o, *in);
  BackendHost host(
      HostOptions{o.backend, o.in_process, o.timeout, in->model_path,
                  BackendSessionOptions{in->weights, o.threads, planned_context(o, *in), o.fault},
                  golden_n_vocab(in->golden)});
  report.info.execution = host.execution();
  write_reports(o, report);  // output paths are checked before any backend call
  if (o.in_process) arm_exit_guard(o.backend);
  try {
    describe_backend(host, report.info);
    const int top_n = backend_top_n(host);
    if (top_n > 0) plan_top_n(o, *in, host, report, top_n);
    if (!o.consistency_only && !o.serving_only && !o.structured_only)
      run_checks(o, *in, host, report, top_n == 0);
    if (wants_consistency(o) && top_n == 0) run_consistency(o, *in, host, report);
    if (wants_serving(o, host, report)) run_serving(o, *in, host, report);
    // Top-N rows: only a backend that enforces grammars itself (its own picks).
    if (wants_structured(o) && (top_n == 0 || host.library().has_grammar())) {
      run_structured(o, *in, host, report);
    } else if (wants_structured(o)) {
      report.not_supported.push_back(
          {"structured", fmt::format("the harness applies a grammar to full logits rows; the "
                                     "backend returns only its top-{} log-probabilities and "
                                     "does not enforce grammars itself",
                                     top_n)});
    }
  } catch (const BackendError& e) {           // the verdict order, as in backend_failure
    if (skips_run(e) && !report.started()) {  // no device here, or this model / path refused
      (e.status() == TS_ERR_DEVICE ? report.skipped : report.unsupported) = e.what();
    } else {  // e.g. a backend that cannot describe itself: a FAIL naming the cause
      report.cases.push_back(backend_failure<CaseResult>(host, report, "backend", e));
    }
  }
  report.complete = true;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.info.finished_at = utc_timestamp(std::chrono::system_clock::now());
  write_reports(o, report);
  disarm_exit_guard();
  fmt::print("{}", format_table(report));
  const std::string verdict = report.verdict();
  if (verdict == "SKIP") return kExitSkip;
  if (verdict == "UNSUPPORTED") return kExitUnsupported;
  if (!o.expect_fail) return report.passed() ? 0 : kExitFail;
  // --expect-fail: the harness must catch the fault and say where.
  const bool caught = expect_fail_caught(report);
  fmt::print("expect-fail: fault {} {}\n", o.fault.empty() ? "(none)" : o.fault,
             caught ? "was caught, first divergent steps named" : "was NOT caught");
  if (caught && !o.expect_step.empty() && !expect_step_met(report, o.expect_step)) {
    fmt::print("expect-step: expected {}: NOT met\n", o.expect_step);
    return kExitFail;
  }
  if (caught && !o.expect_layer.empty() && !expect_layer_met(report, o.expect_layer)) {
    fmt::print("expect-layer: expected {}: NOT met\n", o.expect_layer);
    return kExitFail;
  }
  return caught ? 0 : kExitFail;
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
  cmd->add_option("--timeout", o->timeout,
                  "Time limit per backend call in seconds (child process only; a prefill gets it "
                  "once per 1024 tokens); a call still running after it is a FAIL")
      ->check(finite_seconds());
  cmd->add_flag("--in-process", o->in_process,
                "Load the backend into the harness process (debugging): no time limit, and a "
                "crash takes the run down");
}

// Test only: a fault injected, and what its run must report.
void add_test_options(CLI::App* cmd, Opts* o) {
  cmd->add_option("--fault", o->fault,
                  "Test only: inject a named fault into the backend (the catalog: "
                  "docs/metrics.md#fault-catalog-and-margins)")
      ->check(CLI::IsMember(fault_names()));
  CLI::Option* expect_fail = cmd->add_flag(
      "--expect-fail", o->expect_fail,
      "Test only: succeed iff the verdict is FAIL and every failing case names its first "
      "divergent step");
  cmd->add_option("--expect-step", o->expect_step,
                  "Test only, with --expect-fail: every failing check must fail first at this "
                  "step / position N, or be the named check (CHECK, e.g. consistency.threads), "
                  "or both (CHECK@N); a trailing '+' (CHECK@N+): CHECK must fail so, other "
                  "checks may fail too")
      ->check([](const std::string& spec) {
        const std::string v =
            spec.size() > 1 && spec.ends_with('+') ? spec.substr(0, spec.size() - 1) : spec;
        const size_t at = v.find('@');
        const std::string n = v.find_first_not_of("0123456789") == std::string::npos ? v
                              : at == std::string::npos                              ? "0"
                                                        : v.substr(at + 1);
        return !n.empty() && n.size() < 9 && n.find_first_not_of("0123456789") == std::string::npos
                   ? std::string()
                   : std::string(
                         "N, CHECK or CHECK@N, optionally with a trailing '+' (N a step number)");
      })
      ->needs(expect_fail);
  cmd->add_option("--expect-layer", o->expect_layer,
                  "Test only, with --expect-fail: every failing case's first divergent layer tap "
                  "is L:attn, L:ffn or L:resid, or 'after' (every tap matches: the fault is past "
                  "the last layer)")
      ->check([](const std::string& v) { return expect_layer_spec_error(v); })
      ->needs(expect_fail);
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
  add_test_options(cmd, o.get());
  add_io_options(cmd, o.get());
  cmd->callback([o, &exit_code] { exit_code = run_parity(*o); });
}

}  // namespace touchstone::cli
