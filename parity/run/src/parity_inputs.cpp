// parity_inputs.cpp - planning a parity run: the manifest's suite, cases and
// passages for one model, the pinned golden, the tokenizer, the KV capacity
// every session gets, and the report's header.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "parity_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/harness/chat.h"
#include "touchstone/harness/model_store.h"
#include "touchstone/harness/stale.h"
#include "touchstone/model/faults.h"
#include "touchstone/run/build_info.h"
#include "touchstone/run/model_facts.h"

namespace touchstone {
namespace {

Plan plan_run(const Manifest& m, const Opts& o) {
  const Suite& suite = m.find_suite(o.suite);
  Plan p;
  p.cases = o.cases.empty() ? suite.cases : o.cases;
  p.scoring = o.scoring.empty() ? suite.scoring : o.scoring;
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

}  // namespace

namespace run_detail {

// The vocabulary size the reference recorded: every backend must match it.
int32_t golden_n_vocab(const GoldenFile& g) {
  if (!g.cases.empty()) return g.cases.front().n_vocab;
  return g.scoring.empty() ? 0 : g.scoring.front().n_vocab;
}

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
  // The stale-golden check covers only what this run reads: its cases and
  // passages, and the model's first case (the consistency and serving checks'
  // needle when none is named).
  std::vector<std::string> used = in->plan.cases;
  used.insert(used.end(), in->plan.scoring.begin(), in->plan.scoring.end());
  for (const ManifestCase& c : m.cases) {
    if (c.model == mm.name) {
      used.push_back(c.name);
      break;
    }
  }
  // The GGUF's metadata, read once per file and process (model_facts.h).
  const ModelFacts& facts = model_facts(in->model_path);
  if (!o.trust_goldens) require_fresh_golden(m, mm, in->golden, facts.chat, &used);
  in->tok = std::make_unique<Tokenizer>(facts.tokenizer);
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

// KV capacity (max_context) every session of the run is opened with: the most
// positions any planned check uses, rounded up to a multiple of 1024. A
// backend's own default (max_context = 0) may be smaller than the 4,096-token
// long-context items need (static_graph's is 2048).
std::string session_fault(const Opts& o) {
  return parse_fault(o.fault).vision_path() ? std::string() : o.fault;
}
std::string vision_fault(const Opts& o) {
  return parse_fault(o.fault).vision_path() ? o.fault : std::string();
}

int32_t planned_context(const Opts& o, const Inputs& in) {
  if (in.context > 0) return in.context;  // fixed for the whole plan (ParityRun)
  const Suite& suite = in.manifest.find_suite(o.suite);
  const int max_steps = effective_max_steps(o, suite);
  size_t need = 0;
  if (!o.consistency_only) {
    for (const auto& n : in.plan.cases) {
      const GoldenCase& g = *in.golden.find_case(n);
      size_t steps = g.greedy_ids.size();
      if (max_steps > 0) steps = std::min(steps, size_t(max_steps));
      need = std::max(need, g.prompt_ids.size() + size_t(g.image_tokens) + steps);
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

bool wants_structured(const Opts& o) {
  return o.structured || o.structured_only || !o.structured_checks.empty();
}

bool wants_consistency(const Opts& o) {
  if (o.no_consistency || o.serving_only || o.structured_only) return false;
  return o.consistency || o.consistency_only || (o.cases.empty() && o.scoring.empty());
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

}  // namespace run_detail

ts_weight_path parse_weight_path(const std::string& s) {
  if (s == "full_precision" || s == "fp32") return TS_WEIGHTS_FULL_PRECISION;
  if (s == "quantized") return TS_WEIGHTS_QUANTIZED;
  throw Error("--weights: '{}' is not one of full_precision, quantized", s);
}

const char* weight_path_name(ts_weight_path w) {
  return w == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision";
}

}  // namespace touchstone
