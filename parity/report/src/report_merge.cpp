// report_merge.cpp - shards' JSON reports into the report of their plan
// (touchstone/report/report_merge.h).
#include "touchstone/report/report_merge.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "touchstone/common/error.h"

namespace touchstone {
namespace {

using nlohmann::json;

struct Bundle {
  std::string source;
  json j;
  int index = 0, count = 0;
  std::vector<std::string> plan_items, items;
};

// j[key] of the expected kind, else Error naming the source and pointer.
const json& field(const json& j, const std::string& source, const std::string& ptr,
                  bool (json::*is)() const, const char* kind) {
  const json::json_pointer p(ptr);
  if (!j.contains(p)) throw Error("{}: {}: missing", source, ptr);
  const json& v = j.at(p);
  if (!(v.*is)()) throw Error("{}: {}: expected {}", source, ptr, kind);
  return v;
}

std::vector<std::string> strings(const json& j, const std::string& source, const std::string& ptr) {
  std::vector<std::string> out;
  const json& a = field(j, source, ptr, &json::is_array, "an array of strings");
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string()) throw Error("{}: {}/{}: expected a string", source, ptr, i);
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

Bundle parse_bundle(const std::string& source, const std::string& text) {
  Bundle b{source, {}, 0, 0, {}, {}};
  try {
    b.j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error("{}: not a JSON report (truncated or damaged at byte {}): {}", source, e.byte,
                e.what());
  }
  if (!b.j.is_object() || !b.j.contains("shard")) {
    throw Error(
        "{}: /shard: missing: not one shard of a plan (written by `touchstone parity "
        "--shard I/N --json FILE`)",
        source);
  }
  b.index = field(b.j, source, "/shard/index", &json::is_number_integer, "an integer").get<int>();
  b.count = field(b.j, source, "/shard/count", &json::is_number_integer, "an integer").get<int>();
  for (const char* p : {"/shard/plan_digest", "/shard/goldens_digest"})
    field(b.j, source, p, &json::is_string, "a string");
  b.plan_items = strings(b.j, source, "/shard/plan_items");
  b.items = strings(b.j, source, "/shard/items");
  for (const char* p : {"/cases", "/scoring", "/not_supported"})
    field(b.j, source, p, &json::is_array, "an array");
  field(b.j, source, "/complete", &json::is_boolean, "true or false");
  if (b.count < 1) throw Error("{}: /shard/count: {} (must be at least 1)", source, b.count);
  if (b.index < 0 || b.index >= b.count) {
    throw Error("{}: /shard/index: {} is outside 0..{} (/shard/count {})", source, b.index,
                b.count - 1, b.count);
  }
  return b;
}

// Every bundle against the first: one plan, one set of goldens, one count, no
// index or item twice, no item outside the plan.
void check_bundles(const std::vector<Bundle>& bs) {
  const Bundle& a = bs.front();
  std::map<int, const Bundle*> by_index;
  std::map<std::string, const Bundle*> owner;
  for (const Bundle& b : bs) {
    for (const char* p : {"/shard/plan_digest", "/shard/goldens_digest"}) {
      const json::json_pointer ptr(p);
      if (b.j.at(ptr) != a.j.at(ptr)) {
        throw Error("{}: {}: {} differs from {}'s {}: {}", b.source, p, b.j.at(ptr).dump(),
                    a.source, a.j.at(ptr).dump(),
                    std::string(p).ends_with("plan_digest")
                        ? "another plan (backend, weight path, profile, suite, model, trims, "
                          "checks, items or the durations that split them differ)"
                        : "recorded against other goldens");
      }
    }
    if (b.count != a.count)
      throw Error("{}: /shard/count: {} shards, but {} says {}", b.source, b.count, a.source,
                  a.count);
    if (b.plan_items != a.plan_items)
      throw Error("{}: /shard/plan_items: differ from {}'s", b.source, a.source);
    if (const auto [it, fresh] = by_index.emplace(b.index, &b); !fresh)
      throw Error("{} and {} are both shard {} of {}", it->second->source, b.source, b.index,
                  b.count);
    for (const std::string& item : b.items) {
      if (std::ranges::count(a.plan_items, item) == 0)
        throw Error("{}: /shard/items: '{}' is not an item of the plan", b.source, item);
      if (const auto [it, fresh] = owner.emplace(item, &b); !fresh)
        throw Error("{} and {} both claim item '{}'", it->second->source, b.source, item);
    }
  }
}

// The rows of array `key` of every bundle in plan-item order; rows of no item
// (identity first, the rest last) in shard order.
json merge_rows(const std::vector<const Bundle*>& shards, const std::vector<std::string>& plan,
                const char* key, const char* name_key) {
  std::map<std::string, json> by_item;
  json head = json::array(), tail = json::array();
  for (const Bundle* b : shards) {
    for (const json& row : b->j[key]) {
      const std::string name = row.value(name_key, "");
      const std::string item = plan_item_of(name, std::string(key) == "scoring");
      const bool known = std::ranges::count(plan, item) > 0;
      if (known) {
        by_item[item].push_back(row);
      } else {
        (name.starts_with("identity.") ? head : tail).push_back(row);
      }
    }
  }
  json out = std::move(head);
  for (const std::string& item : plan)
    for (const json& row : by_item[item]) out.push_back(row);
  for (const json& row : tail) out.push_back(row);
  return out;
}

// The verdict order (docs/report-format.md#verdict-order) over merged rows.
std::string merged_verdict(const json& m, const std::vector<const Bundle*>& shards, bool complete,
                           std::string& reason) {
  bool known = false, any = false;
  for (const char* key : {"cases", "scoring"}) {
    for (const json& row : m[key]) {
      any = true;
      const std::string v = row.value("verdict", "FAIL");
      if (v == "FAIL") return "FAIL";
      known = known || v == "KNOWN_DIVERGENCE";
    }
  }
  for (const char* v : {"SKIP", "UNSUPPORTED"}) {
    for (const Bundle* b : shards) {
      if (b->j.value("verdict", "") == v) {
        reason = fmt::format("shard {}: {}", b->index, b->j.value("reason", ""));
        return v;
      }
    }
  }
  if (!complete) return "INCOMPLETE";
  if (!any) return "FAIL";
  return known ? "KNOWN_DIVERGENCE" : "PASS";
}

json shard_entry(const Bundle& b) {
  return {{"index", b.index},
          {"source", b.source},
          {"host", b.j["shard"].value("host", "")},
          {"device", b.j.contains("backend") ? b.j["backend"].value("device", "") : ""},
          {"items", b.items},
          {"verdict", b.j.value("verdict", "")},
          {"complete", b.j["complete"]},
          {"seconds", b.j.value("seconds", 0.0)},
          {"started_at", b.j.value("started_at", json())},
          {"finished_at", b.j.value("finished_at", json())}};
}

// Why the plan is not complete: each missing or unfinished shard.
std::vector<std::string> missing_shards(const std::vector<const Bundle*>& shards, int count) {
  std::vector<std::string> out;
  size_t k = 0;
  for (int i = 0; i < count; ++i) {
    if (k < shards.size() && shards[k]->index == i) {
      if (!shards[k]->j["complete"].get<bool>())
        out.push_back(
            fmt::format("shard {} of {} did not finish ({})", i, count, shards[k]->source));
      ++k;
    } else {
      out.push_back(fmt::format("shard {} of {} is missing", i, count));
    }
  }
  return out;
}

// checks_planned (summed), seconds (the slowest shard's), the earliest start
// and latest finish, and the shards array.
void merge_totals(const std::vector<const Bundle*>& shards, bool complete, json& m) {
  int planned = 0;
  double seconds = 0;
  std::string started, finished;
  for (const Bundle* b : shards) {
    planned += b->j.value("checks_planned", 0);
    seconds = std::max(seconds, b->j.value("seconds", 0.0));
    auto text = [&](const char* k) {
      return b->j.contains(k) && b->j[k].is_string() ? b->j[k].get<std::string>() : std::string();
    };
    const std::string s = text("started_at"), f = text("finished_at");
    if (!s.empty() && (started.empty() || s < started)) started = s;
    if (!f.empty() && f > finished) finished = f;
    m["shards"].push_back(shard_entry(*b));
  }
  m["complete"] = complete;
  m["checks_planned"] = planned;
  m["seconds"] = seconds;
  m["started_at"] = started.empty() ? json() : json(started);
  m["finished_at"] = complete && !finished.empty() ? json(finished) : json();
}

}  // namespace

std::string plan_item_of(const std::string& name, bool scoring) {
  if (scoring) return "scoring:" + name;
  if (name.starts_with("identity.")) return "";
  for (const char* g : {"consistency", "serving"})
    if (name.starts_with(g)) return g;
  if (name.starts_with("structured.") || name == "structured") return "structured";
  return name == "backend" ? "" : "case:" + name;
}

MergedReport merge_shard_reports(const std::vector<std::pair<std::string, std::string>>& sources) {
  if (sources.empty()) throw Error("merge: no shard reports given");
  std::vector<Bundle> bs;
  for (const auto& [name, text] : sources) bs.push_back(parse_bundle(name, text));
  check_bundles(bs);
  std::vector<const Bundle*> shards;
  for (const Bundle& b : bs) shards.push_back(&b);
  std::ranges::sort(shards, {}, &Bundle::index);
  MergedReport out;
  out.missing = missing_shards(shards, shards.front()->count);
  const std::vector<std::string>& plan = shards.front()->plan_items;
  json m = shards.front()->j;
  m.erase("shard");
  m["cases"] = merge_rows(shards, plan, "cases", "name");
  m["scoring"] = merge_rows(shards, plan, "scoring", "name");
  m["not_supported"] = merge_rows(shards, plan, "not_supported", "check");
  const bool complete = out.missing.empty();
  merge_totals(shards, complete, m);
  std::string reason;
  out.verdict = merged_verdict(m, shards, complete, reason);
  if (out.verdict == "INCOMPLETE") reason = fmt::format("{}", fmt::join(out.missing, "; "));
  m["verdict"] = out.verdict;
  m["passed"] = out.verdict == "PASS" || out.verdict == "KNOWN_DIVERGENCE";
  m["reason"] = reason;
  out.json = m.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  return out;
}

}  // namespace touchstone
