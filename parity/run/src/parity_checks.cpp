// parity_checks.cpp - the checks of a parity run: cases and passages against
// the goldens, then the golden-free consistency and structured-output checks.
#include <algorithm>

#include "parity_internal.h"
#include "touchstone/harness/case_image.h"
#include "touchstone/harness/consistency.h"
#include "touchstone/harness/multimodal.h"
#include "touchstone/harness/structured.h"

namespace touchstone::run_detail {
namespace {

// multimodal.encoder: an image case on a backend with its own tower. Its embeddings
// against the golden's (the profile's layer tolerance, NMSE), then the case again with
// the backend's embeddings in the prompt (the same profile). Failures join r's.
void check_encoder(const Inputs& in, BackendHost& host, const GoldenCase& g, int max_steps,
                   CaseResult& r) {
  const std::optional<double> tol = in.profile->layer_tolerance();
  try {
    const ManifestCase& mc = in.manifest.find_case(g.name);
    EncoderCheck e = check_case_encoder(in.manifest, mc, g.image_embeddings, host.model());
    r.encoder_nmse = e.nmse;
    r.encoder_max_abs = e.max_abs;
    r.encoder_preprocessing = e.preprocessed_by_backend ? "the backend" : "the harness";
    if (tol && !(e.nmse <= *tol)) {
      r.failures.push_back(fmt::format(
          "multimodal.encoder: the backend's image embeddings differ from the reference's: "
          "NMSE {:.3e} > {:.1e} (max |diff| {:.3e}; image preprocessed by {})",
          e.nmse, *tol, e.max_abs, r.encoder_preprocessing));
      r.violations.push_back({"encoder", e.nmse, *tol});
    }
    GoldenCase own = g;
    own.image_embeddings = std::move(e.embeddings);
    const CaseResult again = check_case(host.session(), *in.tok, own, *in.profile, max_steps);
    if (!again.passed) {  // its violations join the case's, by the same names
      r.failures.push_back("multimodal.encoder: with the backend's own image embeddings: " +
                           (again.failures.empty() ? std::string("failed") : again.failures[0]));
      r.violations.insert(r.violations.end(), again.violations.begin(), again.violations.end());
      if (again.violations.empty()) r.violations.push_back({"backend_error", 0.0, 0.0});
    }
  } catch (const std::exception& e) {
    r.failures.push_back(fmt::format("multimodal.encoder: {}", e.what()));
    r.violations.push_back({"encoder", 0.0, 0.0});
  }
  r.passed = r.failures.empty();
}

// multimodal.preprocess: an image case on a backend that returns its own pixel tensor
// (ABI v9 preprocess_image), against the processor's (at most one 8-bit level apart).
// Failures join r's.
void check_preprocess(const Inputs& in, BackendHost& host, const GoldenCase& g, CaseResult& r) {
  try {
    const PreprocessCheck p =
        check_case_preprocess(in.manifest, in.manifest.find_case(g.name), host.model());
    if (!p.same_shape()) {
      r.preprocess_shape =
          fmt::format("{} x 3 x {} x {}, the processor's {} x 3 x {} x {}", p.n_frames, p.height,
                      p.width, p.want_frames, p.want_height, p.want_width);
      r.failures.push_back(fmt::format(
          "multimodal.preprocess: the backend's pixel tensor is {} (frames x channels x height "
          "x width)",
          r.preprocess_shape));
      r.violations.push_back({"preprocess_frames", double(p.n_frames), double(p.want_frames)});
    } else {
      r.preprocess_nmse = p.nmse;
      r.preprocess_max_abs = p.max_abs;
      r.preprocess_max_levels = p.max_levels;
      if (!p.passed()) {
        r.preprocess_matching_filter = p.matching_filter;
        const std::string why =
            !p.non_finite.empty() ? fmt::format("a non-finite value at {}", p.non_finite)
            : p.matching_filter.empty()
                ? "none of Pillow's resampling filters reproduces it (another geometry: "
                  "padding, cropping or tiling)"
                : fmt::format(
                      "the processor resizing with {} instead reproduces it within one "
                      "level (a resampling-filter bug)",
                      p.matching_filter);
        r.failures.push_back(fmt::format(
            "multimodal.preprocess: the backend's pixel tensor differs from the processor's: "
            "max |diff| {:.3g} ({:.1f} 8-bit levels > {:g}), NMSE {:.3e}, {} frame(s) of 3 x {} x "
            "{}; {}",
            p.max_abs, p.max_levels, PreprocessCheck::kMaxLevels, p.nmse, p.n_frames, p.height,
            p.width, why));
        r.violations.push_back({"preprocess", p.max_levels, PreprocessCheck::kMaxLevels});
      }
    }
  } catch (const std::exception& e) {
    r.failures.push_back(fmt::format("multimodal.preprocess: {}", e.what()));
    r.violations.push_back({"preprocess", 0.0, 0.0});
  }
  r.passed = r.failures.empty();
}

}  // namespace

// Every check of the plan, in order; reports rewritten after each.
// with_scoring = false: a top-N backend, whose passages are NOT SUPPORTED rows.
void run_checks(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                bool with_scoring, ParityObserver& obs) {
  const Suite& suite = in.manifest.find_suite(o.suite);
  const int max_steps = effective_max_steps(o, suite);
  auto case_units = [&](const std::string& n) { return run_detail::case_units(o, in, n); };
  auto scoring_units = [&](const std::string& n) { return run_detail::scoring_units(o, in, n); };
  double units = 0;
  for (const auto& n : in.plan.cases) units += case_units(n);
  for (const auto& n : in.plan.scoring) units += scoring_units(n);
  obs.planned(size_t(report.n_planned), units);
  const KnownDivergenceKey key{report.info.backend, report.info.model_name, report.info.weight_path,
                               report.info.profile};
  const ProgressFn on_step = [&](int done, int total) { obs.check_progress(done, total); };
  for (const std::string& n : in.plan.cases) {
    if (!with_scoring && in.golden.find_case(n)->has_grammar()) {  // a top-N backend
      report.not_supported.push_back(
          {n,
           "a structured-output case masks every step's full logits row with the grammar's "
           "allowed set; the backend returns only its top-N log-probabilities"});
      --report.n_planned;
      continue;
    }
    if (in.golden.find_case(n)->has_image() && !host.library().has_embeddings()) {
      report.not_supported.push_back(
          {n,
           "an image case puts the image's embeddings in the prompt (ABI v8 prefill_embeddings, "
           "TS_CAP_EMBEDDING_INPUT); the backend takes token ids only"});
      --report.n_planned;
      continue;
    }
    obs.check_started(n, case_units(n));
    report.cases.push_back(guarded<CaseResult>(host, report, n, [&](BackendSession& s) {
      return check_case(s, *in.tok, *in.golden.find_case(n), *in.profile, max_steps, on_step);
    }));
    if (in.golden.find_case(n)->has_image() && host.library().has_preprocess() &&
        report.cases.back().backend_error.empty())
      check_preprocess(in, host, *in.golden.find_case(n), report.cases.back());
    if (in.golden.find_case(n)->has_image() && host.library().has_vision() &&
        report.cases.back().backend_error.empty())
      check_encoder(in, host, *in.golden.find_case(n), max_steps, report.cases.back());
    explain_routing(in, *in.golden.find_case(n), report.cases.back());
    std::vector<float>().swap(report.cases.back().backend_taps);  // read: kept no longer
    in.known.apply(key, report.cases.back());
    const CaseResult& r = report.cases.back();
    obs.check_finished(r.acceptable(), r.seconds,
                       double(in.golden.find_case(n)->prompt_ids.size()) + r.n_total);
    obs.report_updated(report);
  }
  for (const std::string& n : with_scoring ? in.plan.scoring : std::vector<std::string>{}) {
    obs.check_started(n, scoring_units(n));
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
    obs.check_finished(r.acceptable(), r.seconds, double(r.stats.n_positions));
    obs.report_updated(report);
  }
}

namespace {

// multimodal.consistency (touchstone/harness/multimodal.h) on the plan's first image
// case the family attends causally, where the backend takes input embeddings (else
// the image cases are NOT SUPPORTED already); none for a bidirectional image (Gemma 3:
// one block, one call).
void run_image_split(const Inputs& in, BackendHost& host, const BackendSessionOptions& so,
                     Report& report, ParityObserver& obs) {
  const GoldenCase* g = nullptr;
  for (const std::string& n : in.plan.all_cases) {
    const GoldenCase* c = in.golden.find_case(n);
    if (c && c->has_image() && c->image_bidirectional == 0) {
      g = c;
      break;
    }
  }
  if (!g || !host.library().has_embeddings()) return;
  obs.note(fmt::format("multimodal.consistency on case '{}' ({} frames)", g->name,
                       g->frame_positions().size()));
  ++report.n_planned;
  const KnownDivergenceKey key{report.info.backend, report.info.model_name, report.info.weight_path,
                               report.info.profile};
  report.cases.push_back(check_image_split(host.model(), *g, *in.profile, so));
  in.known.apply(key, report.cases.back());
}

}  // namespace

// The golden-free checks (touchstone/harness/consistency.h) on the first case's prompt and
// golden continuation (at most --consistency-tokens, else the suite's
// consistency_tokens, else 96), as five more result rows.
void run_consistency(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                     ParityObserver& obs) {
  const std::string& first = anchor_case(in);
  const GoldenCase& g = *in.golden.find_case(first);
  std::vector<int32_t> tokens = g.prompt_ids;
  tokens.insert(tokens.end(), g.greedy_ids.begin(), g.greedy_ids.end());
  const int n_tokens = consistency_tokens(o, in.manifest.find_suite(o.suite));
  tokens.resize(std::min<size_t>(tokens.size(), size_t(n_tokens)));
  obs.note(fmt::format("consistency checks on case '{}' ({} tokens)", first, tokens.size()));
  try {
    const ts_capabilities caps = host.library().capabilities();
    ConsistencyOptions co{
        BackendSessionOptions{in.weights, o.threads, planned_context(o, in), session_fault(o)},
        (caps.flags & TS_CAP_BITWISE_DETERMINISM) != 0,
        (caps.flags & TS_CAP_ALL_POSITION_LOGITS) != 0,
        {}};
    for (int32_t i = 0; i < std::clamp(caps.n_shape_buckets, 0, 16); ++i)
      co.buckets.push_back(caps.shape_buckets[i]);
    for (CaseResult& r : check_consistency(host.model(), tokens, *in.profile, co))
      report.cases.push_back(std::move(r));
    run_image_split(in, host, co.session, report, obs);
  } catch (const BackendError& e) {
    report.cases.push_back(backend_failure<CaseResult>(host, report, "consistency", e));
  }
  obs.report_updated(report);
}

// The rows of golden-free checks into the report: a row that compared nothing
// is NOT SUPPORTED (its own reason, else `no_rows`), never a PASS; the others
// go through the reviewed known divergences (item: the check's name, e.g.
// serving.prefix_fork, structured.mask_parity).
void add_check_rows(const Inputs& in, const KnownDivergenceKey& key, std::vector<CaseResult> rows,
                    const std::string& no_rows, Report& report, const std::string& case_name) {
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

namespace {

// The structured checks on one grammar case: the first named case with a
// grammar, else the model's first grammar case in the golden.
// The grammar case of the structured checks: the first --case with a grammar;
// else, for a backend that enforces grammars, the first of the plan's and then
// the golden's grammar cases whose kind it takes (llama.cpp's sampler: GBNF),
// so its own enforcement is what the checks judge; else the first of them.
const GoldenCase* structured_case(const Opts& o, const Inputs& in, BackendHost& host) {
  std::vector<const GoldenCase*> cases;
  for (const std::string& n : in.plan.all_cases)
    if (const GoldenCase* c = in.golden.find_case(n); c && c->has_grammar()) cases.push_back(c);
  if (!o.cases.empty() && !cases.empty()) return cases.front();
  for (const GoldenCase& c : in.golden.cases)
    if (c.has_grammar()) cases.push_back(&c);
  if (cases.empty()) return nullptr;
  if (host.library().has_grammar()) {
    for (const GoldenCase* c : cases) {
      BackendSession probe(host.model(), BackendSessionOptions{in.weights, 1, 0, session_fault(o)});
      if (enforce_grammar(probe, *c) == kGrammarByBackend) return c;
    }
  }
  return cases.front();
}

}  // namespace

void run_structured(const Opts& o, const Inputs& in, BackendHost& host, Report& report,
                    ParityObserver& obs) {
  const GoldenCase* g = structured_case(o, in, host);
  if (!g) {
    report.not_supported.push_back(
        {"structured", fmt::format("model '{}' has no grammar case", in.plan.model->name)});
    return obs.report_updated(report);
  }
  StructuredOptions opt;
  opt.session =
      BackendSessionOptions{in.weights, o.threads, planned_context(o, in), session_fault(o)};
  opt.checks = o.structured_checks;
  if (o.max_steps > 0) opt.max_steps = o.max_steps;
  opt.session.max_context = std::max<int32_t>(
      opt.session.max_context, int32_t(g->prompt_ids.size()) + opt.max_steps + opt.draft_length);
  obs.note(fmt::format("structured checks on case '{}' (the backend {} grammars)", g->name,
                       host.library().has_grammar() ? "enforces" : "enforces no"));
  report.n_planned += int(opt.checks.empty() ? structured_check_names().size() : opt.checks.size());
  const KnownDivergenceKey key{report.info.backend, report.info.model_name, report.info.weight_path,
                               report.info.profile};
  try {
    add_check_rows(in, key, check_structured(host.model(), *in.tok, *g, *in.profile, opt),
                   "nothing to compare", report, g->name);
  } catch (const BackendError& e) {
    report.cases.push_back(backend_failure<CaseResult>(host, report, "structured", e));
  }
  obs.report_updated(report);
}

}  // namespace touchstone::run_detail
