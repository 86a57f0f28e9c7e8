#include "touchstone/report/report_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "touchstone/common/error.h"

namespace touchstone {
namespace {

using nlohmann::json;

// Typed access to one JSON object, errors naming the source and JSON pointer.
class Reader {
 public:
  Reader(const std::string& source, const json& j, std::string ptr)
      : source_(source), j_(j), ptr_(std::move(ptr)) {}

  [[noreturn]] void fail(const std::string& key, const char* expected) const {
    throw Error("{}: {}/{}: expected {}", source_, ptr_, key, expected);
  }
  const json* find(const std::string& key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string str(const std::string& key, bool required = false) const {
    const json* v = find(key);
    if (!v && required) fail(key, "a string");
    if (!v) return "";
    if (!v->is_string()) fail(key, "a string");
    return v->get<std::string>();
  }
  double num(const std::string& key, double fallback = 0) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail(key, "a number");
    return v->get<double>();
  }
  int integer(const std::string& key, int fallback = 0) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number_integer()) fail(key, "an integer");
    return v->get<int>();
  }
  bool boolean(const std::string& key) const {
    const json* v = find(key);
    if (v && !v->is_boolean()) fail(key, "true or false");
    return v && v->get<bool>();
  }
  // A member object or array (nullptr when absent); `array` picks which.
  const json* child(const std::string& key, bool array) const {
    const json* v = find(key);
    if (v && (array ? !v->is_array() : !v->is_object()))
      fail(key, array ? "an array" : "an object");
    return v;
  }
  Reader at(const std::string& key) const {
    const json* v = child(key, false);
    static const json empty = json::object();
    return Reader(source_, v ? *v : empty, ptr_ + "/" + key);
  }
  std::vector<std::string> strings(const std::string& key) const {
    std::vector<std::string> out;
    if (const json* a = child(key, true)) {
      for (size_t i = 0; i < a->size(); ++i) {
        if (!(*a)[i].is_string()) fail(fmt::format("{}/{}", key, i), "a string");
        out.push_back((*a)[i].get<std::string>());
      }
    }
    return out;
  }
  // Numbers or null (NaN); booleans are read with bools().
  std::vector<double> numbers(const std::string& key) const {
    std::vector<double> out;
    if (const json* a = child(key, true)) {
      for (size_t i = 0; i < a->size(); ++i) {
        const json& v = (*a)[i];
        if (!v.is_null() && !v.is_number()) fail(fmt::format("{}/{}", key, i), "a number or null");
        out.push_back(v.is_null() ? NAN : v.get<double>());
      }
    }
    return out;
  }
  std::vector<bool> bools(const std::string& key) const {
    std::vector<bool> out;
    if (const json* a = child(key, true)) {
      for (size_t i = 0; i < a->size(); ++i) {
        if (!(*a)[i].is_boolean()) fail(fmt::format("{}/{}", key, i), "true or false");
        out.push_back((*a)[i].get<bool>());
      }
    }
    return out;
  }
  const std::string& source() const { return source_; }
  const std::string& ptr() const { return ptr_; }
  const json& value() const { return j_; }

 private:
  const std::string& source_;
  const json& j_;
  std::string ptr_;
};

void read_series(const Reader& item, ItemView& v) {
  const Reader s = item.at("series");
  v.kl = s.numbers("kl");
  v.margin = s.numbers("ref_top2_margin");
  v.top1_match = s.bools("top1_match");
}

// Serving rows (schema_version 2): the drift of each configuration.
void read_drift(const Reader& c, ItemView& v) {
  const json* d = c.child("drift", true);
  if (!d) return;
  for (size_t i = 0; i < d->size(); ++i) {
    if (!(*d)[i].is_object()) c.fail(fmt::format("drift/{}", i), "an object");
    const Reader e(c.source(), (*d)[i], fmt::format("{}/drift/{}", c.ptr(), i));
    v.drift.push_back({e.str("label"), e.integer("size"), e.integer("rows"), e.num("nmse_max"),
                       e.num("max_abs"), e.boolean("bitwise")});
  }
}

ItemView read_case(const Reader& c) {
  ItemView v;
  v.name = c.str("name", true);
  v.kind = c.str("kind");
  if (v.kind.empty()) v.kind = v.name.starts_with("consistency") ? "consistency" : "greedy";
  v.passed = c.boolean("passed");
  v.known = c.child("known_divergence", false) != nullptr;
  v.failures = c.strings("failures");
  v.compared = c.integer("steps_compared");
  v.total = c.integer("steps_total");
  v.matched = c.integer("tokens_matched");
  v.nmse = c.num("nmse_max");
  v.max_abs = c.num("max_abs");
  v.kld_mean = c.num("kld_mean");
  v.first_failing = c.integer("first_failing_step", c.integer("first_logit_violation_step", -1));
  if (c.child("first_divergence", false)) {
    const Reader d = c.at("first_divergence");
    v.divergence_step = d.integer("step");
    v.divergence =
        fmt::format("reference {} {}, backend {} {}{}", d.integer("ref_id"),
                    d.str("ref_text_escaped"), d.integer("test_id"), d.str("test_text_escaped"),
                    d.boolean("accepted_near_tie") ? " (accepted near-tie)" : "");
  }
  read_series(c, v);
  read_drift(c, v);
  return v;
}

ItemView read_scoring(const Reader& s) {
  ItemView v;
  v.name = s.str("name", true);
  v.kind = "scoring";
  v.passed = s.boolean("passed");
  v.known = s.child("known_divergence", false) != nullptr;
  v.failures = s.strings("failures");
  v.compared = v.total = s.integer("positions");
  v.matched = int(std::lround(s.num("top1_agreement") * v.compared));
  v.nmse = s.num("topk_nmse");
  v.max_abs = s.num("topk_max_abs");
  v.kld_mean = s.at("kld").num("mean");
  v.first_failing = s.integer("first_failing_position", -1);
  read_series(s, v);
  return v;
}

void read_items(const Reader& r, const char* key, RunView& run) {
  const json* a = r.child(key, true);
  if (!a) throw Error("{}: /{}: missing (not a touchstone parity report?)", r.source(), key);
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string ptr = fmt::format("/{}/{}", key, i);
    if (!(*a)[i].is_object()) throw Error("{}: {}: expected an object", r.source(), ptr);
    const Reader item(r.source(), (*a)[i], ptr);
    run.items.push_back(key[0] == 'c' ? read_case(item) : read_scoring(item));
  }
}

// "not_supported" (optional: reports before it have none): NOT SUPPORTED items.
void read_not_supported(const Reader& r, RunView& run) {
  const json* a = r.child("not_supported", true);
  if (!a) return;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string ptr = fmt::format("/not_supported/{}", i);
    if (!(*a)[i].is_object()) throw Error("{}: {}: expected an object", r.source(), ptr);
    const Reader item(r.source(), (*a)[i], ptr);
    ItemView v;
    v.name = item.str("check", true);
    v.kind = "not_supported";
    v.failures = {item.str("reason")};
    run.items.push_back(std::move(v));
  }
}

}  // namespace

RunView parse_report_view(const std::string& json_text, const std::string& source) {
  const json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) throw Error("{}: not valid JSON", source);
  if (!j.is_object())
    throw Error("{}: expected a JSON object (a touchstone parity report)", source);
  const Reader r(source, j, "");
  RunView v;
  v.source = source;
  v.verdict = r.str("verdict", true);
  v.reason = r.str("reason");
  const Reader b = r.at("backend");
  v.backend = b.str("name", true);
  v.backend_version = b.str("version");
  v.device = b.str("device");
  const Reader m = r.at("model");
  v.model = m.str("name", true);
  v.model_sha256 = m.str("sha256");
  v.weights = r.str("weight_path", true);
  v.profile = r.str("profile");
  v.suite = r.str("suite");
  v.revision = r.at("touchstone").str("revision");
  v.started_at = r.str("started_at");
  v.batching = r.at("backend").str("batching");
  v.fork = r.at("backend").str("fork");
  v.near_tie_margin = r.at("tolerances").num("near_tie_margin", -1);
  v.seconds = r.num("seconds");
  v.checks_planned = r.integer("checks_planned");
  read_items(r, "cases", v);
  read_items(r, "scoring", v);
  read_not_supported(r, v);
  return v;
}

RunView read_report_view(const std::string& path) {
  RunView v;
  v.source = v.backend = path;
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    v.verdict = "MISSING";
    v.reason = "no report: " + path;
    return v;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return parse_report_view(ss.str(), path);
  } catch (const std::exception& e) {
    v.verdict = "INVALID";
    v.reason = e.what();
    return v;
  }
}

std::string verdict_counts(const std::vector<RunView>& runs) {
  static const std::array<const char*, 8> kOrder = {
      "PASS",    "KNOWN_DIVERGENCE", "FAIL",        "INCOMPLETE",
      "MISSING", "INVALID",          "UNSUPPORTED", "SKIP"};
  std::string o = fmt::format("{} run{}", runs.size(), runs.size() == 1 ? "" : "s");
  const char* sep = ": ";
  for (const char* v : kOrder) {
    const auto n =
        std::count_if(runs.begin(), runs.end(), [&](const RunView& r) { return r.verdict == v; });
    if (n == 0) continue;
    o += fmt::format("{}{} {}", sep, n, v);
    sep = ", ";
  }
  return o;
}

std::string overall_verdict(const std::vector<RunView>& runs) {
  bool pass = false, unsupported = false, known = false;
  for (const RunView& r : runs) {
    if (r.verdict == "PASS" || r.verdict == "KNOWN_DIVERGENCE") {
      pass = true;
      known = known || r.verdict == "KNOWN_DIVERGENCE";
    } else if (r.verdict == "UNSUPPORTED") {
      unsupported = true;
    } else if (r.verdict != "SKIP") {
      return "FAIL";
    }
  }
  if (runs.empty()) return "FAIL";
  if (known) return "KNOWN_DIVERGENCE";
  return pass ? "PASS" : unsupported ? "UNSUPPORTED" : "SKIP";
}

}  // namespace touchstone
