// backend_file_ctest.cpp - the CTest members of backend.json (structured,
// contract, faults, testmodels, adjust; docs/backend-file.md), read and checked.
#include <filesystem>
#include <string>
#include <vector>

#include "backend_file_obj.h"
#include "touchstone/model/faults.h"
#include "touchstone/run/fault_expectations.h"

namespace touchstone::backend_file {
namespace {

// Each element of j[key] (an array, absent = none) read by `one` with its pointer.
template <typename F>
void each(const json& j, const std::string& path, const char* key, F one) {
  if (!j.contains(key)) return;
  if (!j[key].is_array()) throw Error("{}: /{}: expected an array", path, key);
  for (size_t i = 0; i < j[key].size(); ++i) one(j[key][i], fmt::format("/{}/{}", key, i));
}

void check_fault_names(const std::string& path, const std::string& ptr,
                       const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (std::ranges::count(fault_names(), n) == 0)
      throw Error("{}: {}: '{}' is not a fault of the catalog (touchstone/model/faults.h)", path,
                  ptr, n);
}

BackendFaultEntry fault_entry(const json& e, const std::string& path, const std::string& ptr) {
  const Obj o{
      e, path, ptr, {"weights", "sets", "only", "exclude", "slow", "expect", "max_steps", "why"}};
  o.check();
  BackendFaultEntry f{o.str("weights", true),   o.strs("sets"), o.strs("only"),
                      o.strs("exclude"),        o.strs("slow"), {},
                      o.integer("max_steps", 0)};
  check_weights(path, ptr, f.weights);
  if (f.sets.empty()) throw Error("{}: {}/sets: expected at least one expectation set", path, ptr);
  for (const std::string& set : f.sets)
    if (std::ranges::count(fault_expectation_sets(), set) == 0)
      throw Error("{}: {}/sets: '{}' (expected one of: {})", path, ptr, set,
                  fmt::join(fault_expectation_sets(), ", "));
  check_fault_names(path, ptr + "/only", f.only);
  check_fault_names(path, ptr + "/exclude", f.exclude);
  check_fault_names(path, ptr + "/slow", f.slow);
  if (e.contains("expect")) {
    if (!e["expect"].is_object()) throw Error("{}: {}/expect: expected an object", path, ptr);
    for (const auto& [k, v] : e["expect"].items()) {
      if (!v.is_string()) throw Error("{}: {}/expect/{}: expected a string", path, ptr, k);
      check_fault_names(path, ptr + "/expect", {k});
      f.expect.emplace_back(k, v.get<std::string>());
    }
  }
  return f;
}

BackendAdjust adjust_entry(const json& e, const std::string& path, const std::string& ptr) {
  const Obj o{
      e,
      path,
      ptr,
      {"tests", "except", "labels", "remove_labels", "environment", "resource_groups", "why"}};
  o.check();
  BackendAdjust a{o.strs("tests"),          o.strs("except"),
                  o.strs("labels"),         o.strs("remove_labels"),
                  o.strs("environment"),    e.contains("environment"),
                  o.str("resource_groups"), ptr};
  if (a.tests.empty())
    throw Error("{}: {}/tests: expected at least one test name pattern", path, ptr);
  return a;
}

void need_parity(const BackendFile& b, const std::string& ptr, const std::string& w) {
  if (!b.parity_for(w)) throw Error("{}: {}/weights: '{}' has no /parity entry", b.path, ptr, w);
}

}  // namespace

void read_ctest_members(const json& j, const std::string& path, BackendFile& b) {
  each(j, path, "structured", [&](const json& e, const std::string& ptr) {
    const Obj o{e, path, ptr, {"weights", "models", "cases", "labels", "why"}};
    o.check();
    b.structured.push_back(
        {o.str("weights", true), o.strs("models"), o.strs("cases"), o.strs("labels")});
    check_weights(path, ptr, b.structured.back().weights);
    need_parity(b, ptr, b.structured.back().weights);
  });
  each(j, path, "contract", [&](const json& e, const std::string& ptr) {
    const Obj o{e, path, ptr, {"weights", "profile", "child", "labels", "environment", "why"}};
    o.check();
    b.contract.push_back({o.str("weights", true), o.str("profile"), o.boolean("child", false),
                          o.strs("labels"), o.strs("environment")});
    check_weights(path, ptr, b.contract.back().weights);
  });
  each(j, path, "faults", [&](const json& e, const std::string& ptr) {
    b.faults.push_back(fault_entry(e, path, ptr));
  });
  each(j, path, "testmodels", [&](const json& e, const std::string& ptr) {
    const Obj o{e,
                path,
                ptr,
                {"weights", "labels", "environment", "exclude", "timeout", "manifest", "args",
                 "known_divergences", "why"}};
    o.check();
    const auto beside = [&](std::string rel) {  // a path relative to the backend file
      if (rel.empty()) return rel;
      return std::filesystem::absolute(std::filesystem::path(path).parent_path() / rel)
          .lexically_normal()
          .string();
    };
    std::string manifest = o.str("manifest");
    if (!manifest.empty())
      manifest = (std::filesystem::path(path).parent_path() / manifest).lexically_normal().string();
    b.testmodels.push_back({o.strs("weights"), o.strs("labels"), o.strs("environment"),
                            o.strs("exclude"), o.integer("timeout", 0), manifest, o.strs("args"),
                            beside(o.str("known_divergences"))});
    for (const std::string& w : b.testmodels.back().weights) check_weights(path, ptr, w);
  });
  each(j, path, "adjust", [&](const json& e, const std::string& ptr) {
    b.adjust.push_back(adjust_entry(e, path, ptr));
  });
}

}  // namespace touchstone::backend_file
