// Known divergences: loading (strict, every error names file, entry and field)
// and matching against results (touchstone/harness/known_divergence.h).
#include "touchstone/harness/known_divergence.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/json_depth.h"

namespace touchstone {
namespace {

using json = nlohmann::json;

// Not `bitwise`: that violation is a capability the backend still claims
// (TS_CAP_BITWISE_DETERMINISM, TS_CAP_BATCH_INVARIANT) failing. A broken claim is
// withdrawn where it does not hold, never waived (docs/known-divergences.md).
// mask_difference: tokens one grammar engine allows and the golden's does not
// (or the reverse) at one step of a structured case.
constexpr std::array<const char*, 12> kCoverable = {
    "logits_nmse",       "logits_max_abs",  "kld_mean", "kld_p99",
    "top1_agreement",    "ppl_ratio",       "greedy",   "argmax",
    "isolation_max_abs", "mask_difference", "encoder",  "preprocess"};
const std::set<std::string> kEntryKeys = {"id",          "backend", "model", "weights",
                                          "profile",     "item",    "why",   "measured_on",
                                          "reviewed_by", "checks"};

class EntryReader {
 public:
  EntryReader(const std::string& file, size_t index, const json& j)
      : where_(fmt::format("{}: entries[{}]", file, index)), j_(j) {}

  std::string text(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end() || !it->is_string() || it->get<std::string>().empty())
      throw Error("{}: '{}' must be a non-empty string", where_, key);
    return it->get<std::string>();
  }

  double number(const json& o, const std::string& check, const char* key) const {
    const auto it = o.find(key);
    if (it == o.end() || !it->is_number() || !std::isfinite(it->get<double>()))
      throw Error("{}: checks.{}.{} must be a finite number", where_, check, key);
    return it->get<double>();
  }

  const std::string& where() const { return where_; }

 private:
  std::string where_;
  const json& j_;
};

KnownDivergence read_entry(const std::string& file, size_t index, const json& j) {
  const EntryReader in(file, index, j);
  if (!j.is_object()) throw Error("{}: must be an object", in.where());
  for (const auto& [k, v] : j.items()) {
    if (!kEntryKeys.count(k)) throw Error("{}: unknown field '{}'", in.where(), k);
  }
  KnownDivergence e;
  e.id = in.text("id");
  e.backend = in.text("backend");
  e.model = in.text("model");
  e.weights = in.text("weights");
  e.profile = in.text("profile");
  e.item = in.text("item");
  e.why = in.text("why");
  e.measured_on = in.text("measured_on");
  e.reviewed_by = in.text("reviewed_by");
  e.source = fmt::format("{}, entry {}", file, index);
  if (e.weights != "quantized" && e.weights != "full_precision")
    throw Error("{}: 'weights' must be quantized or full_precision, got '{}'", in.where(),
                e.weights);
  const auto checks = j.find("checks");
  if (checks == j.end() || !checks->is_object() || checks->empty())
    throw Error("{}: 'checks' must be a non-empty object", in.where());
  for (const auto& [name, b] : checks->items()) {
    if (name == "bitwise")
      throw Error(
          "{}: checks.bitwise: a failed bitwise claim is withdrawn, not waived: the backend "
          "must declare TS_CAP_BITWISE_DETERMINISM / TS_CAP_BATCH_INVARIANT only where it holds "
          "(e.g. TS_CAP_BITWISE_NOT_ACROSS_FORKS, batch_invariant_paths; "
          "docs/known-divergences.md)",
          in.where());
    if (!KnownDivergences::coverable(name))
      throw Error("{}: checks.{}: not a check a known divergence can cover (one of: {})",
                  in.where(), name, fmt::join(kCoverable, ", "));
    if (!b.is_object() || b.size() != 2)
      throw Error("{}: checks.{} must be {{\"measured\": x, \"accept\": y}}", in.where(), name);
    KnownDivergence::Bound bound{in.number(b, name, "measured"), in.number(b, name, "accept")};
    const bool lower = KnownDivergences::lower_bound(name);
    if (lower ? bound.accept > bound.measured : bound.accept < bound.measured)
      throw Error(
          "{}: checks.{}: accept {} is stricter than the measured {}: the entry would "
          "not accept its own measurement",
          in.where(), name, bound.accept, bound.measured);
    e.checks[name] = bound;
  }
  return e;
}

bool within(const std::string& check, double value, double accept) {
  return KnownDivergences::lower_bound(check) ? value >= accept : value <= accept;
}

template <typename Result>
void apply_entry(const KnownDivergence& e, Result& r) {
  if (r.passed) {
    r.passed = false;
    r.failures.push_back(fmt::format(
        "known divergence '{}' ({}) no longer reproduces: every check passes; remove the entry",
        e.id, e.source));
    r.violations.push_back({"known_divergence", 0.0, 0.0});
    return;
  }
  KnownDivergenceMatch m{e.id, e.why, e.reviewed_by, e.measured_on, e.source, {}};
  std::vector<std::string> problems;
  if (r.violations.empty()) problems.push_back("the failure names no criterion");
  for (const Violation& v : r.violations) {
    const auto it = e.checks.find(v.check);
    if (it == e.checks.end()) {
      problems.push_back(KnownDivergences::coverable(v.check)
                             ? fmt::format("{} ({:.3e}) is not in the entry", v.check, v.value)
                             : fmt::format("{} is never a known divergence", v.check));
    } else if (!within(v.check, v.value, it->second.accept)) {
      problems.push_back(fmt::format("{} {:.3e} is beyond the accepted {:.3e} (measured {:.3e})",
                                     v.check, v.value, it->second.accept, it->second.measured));
    } else {
      m.checks.push_back({v.check, v.value, it->second.measured, it->second.accept});
    }
  }
  if (problems.empty()) {
    r.known_divergence = std::move(m);
    return;
  }
  r.failures.push_back(fmt::format("known divergence '{}' ({}) does not cover this failure: {}",
                                   e.id, e.source, fmt::join(problems, "; ")));
  r.violations.push_back({"known_divergence", 0.0, 0.0});
}

}  // namespace

bool KnownDivergences::coverable(const std::string& check) {
  for (const char* c : kCoverable)
    if (check == c) return true;
  return false;
}

bool KnownDivergences::lower_bound(const std::string& check) {
  return check == "top1_agreement" || check == "greedy";
}

void KnownDivergences::load(const std::string& path) {
  const std::string text = fileio::read_file(path, "known divergences");
  json j;
  check_json_depth(text, path);
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error("{}: not valid JSON (byte {}): {}", path, e.byte, e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range 406: a number overflows (1e400)
    throw Error("{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object() || j.value("format", "") != "touchstone-known-divergences")
    throw Error("{}: 'format' must be \"touchstone-known-divergences\"", path);
  if (!j.contains("version") || j["version"] != 1)
    throw Error("{}: 'version' must be 1 (this Touchstone reads version 1)", path);
  for (const auto& [k, v] : j.items()) {
    if (k != "format" && k != "version" && k != "entries")
      throw Error("{}: unknown field '{}'", path, k);
  }
  if (!j.contains("entries") || !j["entries"].is_array())
    throw Error("{}: 'entries' must be an array", path);
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    KnownDivergence e = read_entry(path, i, j["entries"][i]);
    for (const KnownDivergence& o : entries_) {
      if (o.id == e.id) throw Error("{}: id '{}' is used twice ({})", e.source, e.id, o.source);
      if (o.backend == e.backend && o.model == e.model && o.weights == e.weights &&
          o.profile == e.profile && o.item == e.item)
        throw Error("{}: a second entry for {} / {} / {} / {} / {} ({})", e.source, e.backend,
                    e.model, e.weights, e.profile, e.item, o.source);
    }
    entries_.push_back(std::move(e));
  }
}

const KnownDivergence* KnownDivergences::find(const KnownDivergenceKey& k,
                                              const std::string& item) const {
  for (const KnownDivergence& e : entries_) {
    if (e.backend == k.backend && e.model == k.model && e.weights == k.weights &&
        e.profile == k.profile && e.item == item)
      return &e;
  }
  return nullptr;
}

void KnownDivergences::apply(const KnownDivergenceKey& key, CaseResult& r) const {
  if (const KnownDivergence* e = find(key, r.name)) apply_entry(*e, r);
}

void KnownDivergences::apply(const KnownDivergenceKey& key, CaseResult& r,
                             const std::string& case_name) const {
  const KnownDivergence* e = find(key, r.name + "@" + case_name);
  if (e == nullptr) e = find(key, r.name);
  if (e != nullptr) apply_entry(*e, r);
}

void KnownDivergences::apply(const KnownDivergenceKey& key, ScoringResult& r) const {
  if (const KnownDivergence* e = find(key, r.name)) apply_entry(*e, r);
}

}  // namespace touchstone
