// The JSON report (docs/report-format.md; schema docs/report.schema.json).
#include <cmath>

#include <nlohmann/json.hpp>

#include "report_text.h"
#include "touchstone/report/report.h"

namespace touchstone {
namespace {

using nlohmann::json;
using report_detail::finite_or;
using report_detail::printable;

// A series value: JSON has no NaN / Inf, so a non-finite value is null.
json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json optional_number(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json text_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json divergence_json(const GreedyDivergence& d) {
  return json{{"step", d.step},
              {"ref_id", d.ref_id},
              {"test_id", d.test_id},
              {"ref_text_escaped", printable(d.ref_text)},
              {"test_text_escaped", printable(d.test_text)},
              {"ref_top2_margin", d.ref_margin},
              {"accepted_near_tie", d.accepted},
              {"test_in_ref_topk", d.test_in_ref_topk},
              {"ref_in_test_topk", d.ref_in_test_topk}};
}

json backend_json(const RunInfo& i) {
  json b{{"name", i.backend},
         {"path", i.backend_path},
         {"device", i.device},
         {"version", i.backend_version},
         {"api_version", i.backend_api_version},
         {"capabilities", nullptr}};
  if (i.capabilities) {
    const BackendCapabilities& c = *i.capabilities;
    b["capabilities"] = {{"flags", c.flags},
                         {"weight_types", c.weight_types},
                         {"max_context", c.max_context},
                         {"shape_buckets", c.shape_buckets},
                         {"determinism_note", text_or_null(c.determinism_note)},
                         {"top_n", c.top_n},
                         {"batch_invariant_paths", c.batch_invariant_paths},
                         {"max_batch", c.max_batch}};
  }
  b["batching"] = text_or_null(i.batching);
  b["fork"] = text_or_null(i.fork);
  return b;
}

json tolerances_json(const std::optional<Profile>& p) {
  if (!p) return nullptr;
  return {{"name", p->name},
          {"greedy", p->greedy},
          {"near_tie_margin", p->near_tie_margin},
          {"near_tie_top_k", p->near_tie_top_k},
          {"logits_nmse_max", optional_number(p->logits_nmse_max)},
          {"logits_max_abs_max", optional_number(p->logits_max_abs_max)},
          {"kld_mean_max", optional_number(p->kld_mean_max)},
          {"kld_p99_max", optional_number(p->kld_p99_max)},
          {"top1_agreement_min", optional_number(p->top1_agreement_min)},
          {"ppl_ratio_max", optional_number(p->ppl_ratio_max)},
          {"layer_nmse_max", optional_number(p->layer_nmse_max)}};
}

json case_series_json(const CaseResult& c) {
  json s{{"full_row_steps", c.full_row_steps}};
  json top1 = json::array(), margin = json::array(), kl = json::array(), nmse = json::array(),
       max_abs = json::array();
  for (const StepPoint& p : c.series) {
    top1.push_back(p.top1_match);
    margin.push_back(finite_or_null(p.ref_margin));
    kl.push_back(finite_or_null(p.kl));
    nmse.push_back(finite_or_null(p.nmse));
    max_abs.push_back(finite_or_null(p.max_abs));
  }
  s["top1_match"] = std::move(top1);
  s["ref_top2_margin"] = std::move(margin);
  s["kl"] = std::move(kl);
  s["nmse"] = std::move(nmse);
  s["max_abs"] = std::move(max_abs);
  return s;
}

json scoring_series_json(const ScoringResult& r) {
  json top1 = json::array(), kl = json::array(), nmse = json::array(), max_abs = json::array();
  for (const PositionPoint& p : r.series) {
    top1.push_back(p.top1_match);
    kl.push_back(finite_or_null(p.kl));
    nmse.push_back(finite_or_null(p.nmse));
    max_abs.push_back(finite_or_null(p.max_abs));
  }
  return {{"top1_match", std::move(top1)},
          {"kl", std::move(kl)},
          {"nmse", std::move(nmse)},
          {"max_abs", std::move(max_abs)}};
}

json layer_json(const std::optional<LayerDivergence>& l) {
  if (!l) return nullptr;
  json j = {{"step", l->step},
            {"layer", l->layer},
            {"point", l->point_name()},
            {"nmse", finite_or(l->nmse, -1)},
            {"tolerance", l->tolerance}};
  if (!l->explanation.empty()) j["explanation"] = l->explanation;
  return j;
}

json violations_json(const std::vector<Violation>& vs) {
  json a = json::array();
  for (const Violation& v : vs)
    a.push_back({{"check", v.check}, {"value", finite_or(v.value, -1)}, {"limit", v.limit}});
  return a;
}

json known_json(const std::optional<KnownDivergenceMatch>& k) {
  if (!k) return nullptr;
  json checks = json::array();
  for (const auto& c : k->checks) {
    checks.push_back({{"check", c.check},
                      {"value", finite_or(c.value, -1)},
                      {"measured", c.measured},
                      {"accept", c.accept}});
  }
  return {{"id", k->id},
          {"why", k->why},
          {"reviewed_by", k->reviewed_by},
          {"measured_on", k->measured_on},
          {"source", k->source},
          {"checks", std::move(checks)}};
}

template <typename Result>
const char* item_verdict(const Result& r) {
  return r.passed ? "PASS" : r.known_divergence ? "KNOWN_DIVERGENCE" : "FAIL";
}

// "consistency.*", "serving.*" and "structured.*" rows, "identity.*" rows (a
// server's model identity), greedy cases (a grammar case "structured_x" too).
const char* case_kind(const std::string& name) {
  if (name.starts_with("consistency")) return "consistency";
  if (name.starts_with("serving")) return "serving";
  if (name.starts_with("structured.")) return "structured";
  return name.starts_with("identity.") ? "identity" : "greedy";
}

json case_json(const CaseResult& c) {
  json cj{{"name", c.name},
          {"kind", case_kind(c.name)},
          {"passed", c.passed},
          {"failures", c.failures},
          {"steps_compared", c.n_steps},
          {"steps_total", c.n_total},
          {"tokens_matched", c.n_matched},
          {"nmse_max", finite_or(c.nmse_max, -1)},
          {"max_abs", finite_or(c.max_abs, -1)},
          {"kld_mean", finite_or(c.kld_mean, -1)},
          {"kld_max", finite_or(c.kld_max, -1)},
          {"nonfinite_logits", c.nonfinite},
          {"device_greedy_steps", c.device_greedy_steps},
          {"seconds", c.seconds},
          {"first_logit_violation_step", c.first_logit_violation_step},
          {"first_logit_violation", c.first_logit_violation},
          {"first_failing_step", first_failing_step(c)},
          {"backend_error", c.backend_error}};
  if (!c.grammar_enforcement.empty()) cj["grammar_enforcement"] = c.grammar_enforcement;
  cj["first_divergence"] =
      c.first_divergence ? divergence_json(*c.first_divergence) : json(nullptr);
  cj["near_ties"] = json::array();
  for (const auto& d : c.near_ties) cj["near_ties"].push_back(divergence_json(d));
  cj["tap_steps_compared"] = c.tap_steps_compared;
  if (!c.routing.empty()) cj["routing"] = c.routing;
  if (!std::isnan(c.encoder_nmse)) {
    auto finite = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
    cj["encoder_nmse"] = finite(c.encoder_nmse);
    cj["encoder_max_abs"] = finite(c.encoder_max_abs);
    cj["encoder_preprocessing"] = c.encoder_preprocessing;
  }
  if (!std::isnan(c.preprocess_nmse) || !c.preprocess_shape.empty()) {
    auto finite = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
    cj["preprocess_nmse"] = finite(c.preprocess_nmse);
    cj["preprocess_max_abs"] = finite(c.preprocess_max_abs);
    cj["preprocess_max_levels"] = finite(c.preprocess_max_levels);
    if (!c.preprocess_shape.empty()) cj["preprocess_shape"] = c.preprocess_shape;
    if (!c.preprocess_matching_filter.empty())
      cj["preprocess_matching_filter"] = c.preprocess_matching_filter;
  }
  cj["first_layer_divergence"] = layer_json(c.first_layer_divergence);
  cj["series"] = case_series_json(c);
  cj["verdict"] = item_verdict(c);
  cj["violations"] = violations_json(c.violations);
  cj["known_divergence"] = known_json(c.known_divergence);
  cj["logprobs_top_n"] = c.logprobs_top_n;
  cj["not_supported"] = c.not_supported;
  cj["topn_missing_max"] = c.topn_missing_max;
  cj["drift"] = json::array();
  for (const DriftPoint& d : c.drift) {
    cj["drift"].push_back({{"label", d.label},
                           {"size", d.size},
                           {"rows", d.rows},
                           {"nmse_max", finite_or(d.nmse_max, -1)},
                           {"max_abs", finite_or(d.max_abs, -1)},
                           {"bitwise", d.bitwise}});
  }
  return cj;
}

json scoring_json(const ScoringResult& s) {
  const auto& st = s.stats;
  return {{"name", s.name},
          {"passed", s.passed},
          {"failures", s.failures},
          {"positions", st.n_positions},
          {"kld",
           {{"mean", finite_or(st.kld.mean, -1)},
            {"median", finite_or(st.kld.median, -1)},
            {"p90", finite_or(st.kld.p90, -1)},
            {"p95", finite_or(st.kld.p95, -1)},
            {"p99", finite_or(st.kld.p99, -1)},
            {"max", finite_or(st.kld.max, -1)}}},
          {"max_ref_tail_mass", st.max_p_tail},
          {"max_kl_gap_bound", finite_or(st.max_kl_gap_bound, -1)},
          {"top1_agreement", st.top1_agreement},
          {"rms_delta_p", finite_or(st.rms_delta_p, -1)},
          {"ppl_ref", st.ppl_ref},
          {"ppl_test", finite_or(st.ppl_test, -1)},
          {"ppl_ratio", finite_or(st.ppl_ratio, -1)},
          {"topk_nmse", finite_or(s.topk_nmse, -1)},
          {"topk_max_abs", finite_or(s.topk_max_abs, -1)},
          {"first_failing_position", s.first_failing_position},
          {"first_failing", s.first_failing},
          {"backend_error", s.backend_error},
          {"seconds", s.seconds},
          {"series", scoring_series_json(s)},
          {"verdict", item_verdict(s)},
          {"violations", violations_json(s.violations)},
          {"known_divergence", known_json(s.known_divergence)}};
}

}  // namespace

std::string to_json(const Report& r) {
  json j;
  const RunInfo& i = r.info;
  j["schema_version"] = kReportSchemaVersion;
  j["touchstone"] = {{"version", i.touchstone_version}, {"revision", i.touchstone_revision}};
  j["started_at"] = text_or_null(i.started_at);
  j["finished_at"] = text_or_null(i.finished_at);
  j["backend"] = backend_json(i);
  j["model"] = {{"name", i.model_name}, {"sha256", i.model_sha256}, {"file", i.model_file}};
  j["weight_path"] = i.weight_path;
  j["profile"] = i.profile;
  j["tolerances"] = tolerances_json(i.tolerances);
  j["suite"] = i.suite;
  j["n_threads"] = i.n_threads;
  j["execution"] = i.execution;
  j["complete"] = r.complete;
  j["checks_planned"] = r.n_planned;
  j["passed"] = r.passed();
  j["verdict"] = r.verdict();
  j["reason"] = r.skipped + r.unsupported;
  j["seconds"] = r.seconds;
  j["cases"] = json::array();
  for (const CaseResult& c : r.cases) j["cases"].push_back(case_json(c));
  j["scoring"] = json::array();
  for (const ScoringResult& s : r.scoring) j["scoring"].push_back(scoring_json(s));
  j["not_supported"] = json::array();
  for (const NotSupportedCheck& n : r.not_supported)
    j["not_supported"].push_back({{"check", n.check}, {"reason", n.reason}});
  if (r.shard) {
    const ShardInfo& sh = *r.shard;
    j["shard"] = {{"index", sh.index},
                  {"count", sh.count},
                  {"plan_digest", sh.plan_digest},
                  {"goldens_digest", sh.goldens_digest},
                  {"plan_items", sh.plan_items},
                  {"items", sh.items},
                  {"host", sh.host}};
  }
  // Backend names, device strings and token bytes may be any bytes: invalid
  // UTF-8 is replaced (U+FFFD), never thrown on after the verdict.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace touchstone
