// ctest_plan.cpp - parity, serving, structured, contract and test-model CTests
// of the backend files (touchstone/run/ctest_plan.h).
#include "touchstone/run/ctest_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "ctest_internal.h"
#include "touchstone/common/error.h"

namespace touchstone {
namespace ctest {

std::vector<std::string> profile_options(const BackendFile& b, const std::string& weights) {
  std::vector<std::string> o;
  const BackendParityEntry* e = b.parity_for(weights);
  if (e && !e->profile.empty()) o.insert(o.end(), {"--profile", e->profile});
  if (e && !e->known_divergences.empty())
    o.insert(o.end(),
             {"--known-divergences",
              std::filesystem::absolute(e->known_divergences).lexically_normal().string()});
  return o;
}

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::ranges::count(v, s) > 0;
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string junit(const Gen& g, const std::string& t) {
  return g.ctx.report_dir + "/" + t + ".xml";
}

// The items of a ci_suite ("" = none: every item is in CI).
std::vector<std::string> ci_items(const Gen& g, const std::string& suite, const std::string& ptr) {
  if (suite.empty()) return {};
  for (const Suite& s : g.manifest.suites)
    if (s.name == suite) return cat(s.cases, s.scoring);
  throw Error("{}: {}/ci_suite: no suite '{}' in {}", g.b.path, ptr, suite, g.manifest.path);
}

// One per-case or per-passage parity test of entry e (see _item_labels).
void add_item(const Gen& g, const BackendParityEntry& e, const std::vector<std::string>& ci,
              const std::string& item, const std::string& model,
              const std::vector<std::string>& tags, bool scoring) {
  const std::string t =
      fmt::format("parity.{}.{}.{}{}", g.b.name, e.weights, scoring ? "scoring." : "", item);
  std::vector<std::string> extra;
  int cost = 0;
  if (has(tags, "long_context")) {
    extra.push_back("long_context");
    cost = 300;  // started early by `ctest -j` (COST), not left to run alone at the end
  }
  if (std::ranges::any_of(e.slow_tags, [&](const std::string& s) { return has(tags, s); }))
    extra.push_back("slow");
  if (!ci.empty() && !has(ci, item) && !has(extra, "slow")) extra.push_back("slow");
  std::vector<std::string> labels = {"parity", g.b.name, e.weights, model, e.tier};
  if (!e.profile.empty()) labels.push_back(e.profile);
  g.out.push_back(
      skippable(t,
                cat(cat({g.ctx.cli, "parity", "--backend", g.backend_arg, "--weights", e.weights},
                        profile_options(g.b, e.weights)),
                    {scoring ? "--scoring" : "--case", item, "--threads", "1", "--manifest",
                     g.ctx.manifest, "--junit", junit(g, t)}),
                cat(labels, extra), g.ctx.one_thread_env, 1200, 0, cost));
}

// parity[]: a test per case and passage of the manifest's full suite whose
// model is one of the entry's, then the consistency test.
void add_parity(const Gen& g) {
  const Suite& full = g.manifest.find_suite("full");
  for (size_t i = 0; i < g.b.parity.size(); ++i) {
    const BackendParityEntry& e = g.b.parity[i];
    const std::vector<std::string> ci = ci_items(g, e.ci_suite, fmt::format("/parity/{}", i));
    const std::vector<std::string> models =
        e.models.empty() ? std::vector<std::string>{g.manifest.models.at(0).name} : e.models;
    for (const std::string& c : full.cases) {
      const ManifestCase& mc = g.manifest.find_case(c);
      if (has(models, mc.model)) add_item(g, e, ci, c, mc.model, mc.tags, false);
    }
    for (const std::string& s : full.scoring) {
      const ManifestScoring& ms = g.manifest.find_scoring(s);
      if (has(models, ms.model)) add_item(g, e, ci, s, ms.model, ms.tags, true);
    }
    const std::string t = fmt::format("parity.{}.{}.consistency", g.b.name, e.weights);
    std::vector<std::string> labels = {"parity", "consistency", g.b.name, e.weights, e.tier};
    if (!e.profile.empty()) labels.push_back(e.profile);
    g.out.push_back(
        skippable(t,
                  cat(cat({g.ctx.cli, "parity", "--backend", g.backend_arg, "--weights", e.weights},
                          profile_options(g.b, e.weights)),
                      {"--consistency-only", "--consistency-tokens", "24", "--manifest",
                       g.ctx.manifest, "--junit", junit(g, t)}),
                  labels, {}, 1200, 2));
  }
}

void add_serving(const Gen& g) {
  for (const BackendServingEntry& s : g.b.serving) {
    std::vector<std::string> models = s.models;
    if (models.empty())
      for (const ManifestModel& m : g.manifest.models) models.push_back(m.name);
    const std::string plan = s.plan.empty() ? "quick" : s.plan;
    for (const std::string& m : models) {
      const std::string t =
          fmt::format("serving.{}.{}.{}{}", g.b.name, s.weights, m, plan == "full" ? ".full" : "");
      g.out.push_back(skippable(t,
                                cat(cat({g.ctx.cli, "parity", "--backend", g.backend_arg,
                                         "--weights", s.weights, "--model", m},
                                        profile_options(g.b, s.weights)),
                                    {"--serving-only", "--serving-plan", plan, "--threads", "1",
                                     "--manifest", g.ctx.manifest, "--junit", junit(g, t)}),
                                cat({"parity", "serving", g.b.name, s.weights, m}, s.labels),
                                g.ctx.one_thread_env, 1800, 0));
    }
  }
}

void add_structured(const Gen& g) {
  for (const BackendStructuredEntry& s : g.b.structured) {
    for (const std::string& name : cat(s.models, s.cases)) {
      const bool model = has(s.models, name);
      const std::string t = fmt::format("structured.{}.{}.{}", g.b.name, s.weights, name);
      g.out.push_back(
          skippable(t,
                    cat(cat({g.ctx.cli, "parity", "--backend", g.backend_arg, "--weights",
                             s.weights, model ? "--model" : "--case", name},
                            profile_options(g.b, s.weights)),
                        {"--structured-only", "--threads", "1", "--manifest", g.ctx.manifest,
                         "--junit", junit(g, t)}),
                    cat({"parity", "structured", g.b.name, s.weights}, s.labels),
                    g.ctx.one_thread_env, 900, 0));
    }
  }
}

void add_contract(const Gen& g) {
  for (const BackendContractEntry& c : g.b.contract) {
    if (g.ctx.contract_test.empty())
      throw Error(
          "{}: /contract: touchstone-contract-test is not available (built without "
          "BUILD_TESTING)",
          g.b.path);
    std::vector<std::string> cmd = {g.ctx.contract_test, "--backend", g.backend_arg,   "--weights",
                                    c.weights,           "--model",   g.ctx.model_path};
    if (!c.profile.empty())
      cmd.insert(cmd.end(), {"--profile", c.profile, "--manifest", g.ctx.manifest});
    std::string t = fmt::format("contract.{}.{}", g.b.name, c.weights);
    if (c.child) {
      cmd.push_back("--child");
      t += ".child";
    }
    g.out.push_back(
        skippable(t, cmd, cat({"contract", g.b.name, c.weights}, c.labels), c.environment, 600, 0));
  }
}

void add_testmodels(const Gen& g) {
  for (const BackendTestModelEntry& e : g.b.testmodels) {
    std::optional<Manifest> own;
    if (!e.manifest.empty()) own = load_manifest(e.manifest);
    const Manifest* tm = own ? &*own : g.test_models;
    if (!tm) throw Error("{}: /testmodels: no test-model manifest was given", g.b.path);
    for (const ManifestModel& m : tm->models) {
      for (const std::string& w : e.weights) {
        if (has(e.exclude, m.name + ":" + w)) continue;
        const std::string t = fmt::format("testmodel.{}.{}.{}", g.b.name, w, m.name);
        std::vector<std::string> args = e.args;
        if (!e.known_divergences.empty())
          args.insert(args.end(), {"--known-divergences", e.known_divergences});
        g.out.push_back(
            skippable(t,
                      cat({g.ctx.cli, "parity", "--manifest", tm->path, "--model", m.name,
                           "--backend", g.backend_arg, "--weights", w, "--no-consistency",
                           "--threads", "1", "--junit", junit(g, t)},
                          args),
                      cat({"parity", "testmodel", g.b.name, w}, e.labels), e.environment,
                      e.timeout > 0 ? e.timeout : 300, 0));
      }
    }
  }
}

}  // namespace
}  // namespace ctest

std::vector<CtestTest> ctest_plan(const std::vector<CtestBackend>& backends,
                                  const Manifest& manifest, const Manifest* test_models,
                                  const CtestContext& ctx) {
  std::vector<CtestTest> out;
  std::set<std::string> seen;
  for (const CtestBackend& cb : backends) {
    const size_t first = out.size();
    const ctest::Gen g{
        cb.file, cb.library.empty() ? cb.file.name : cb.library, manifest, test_models, ctx, out};
    ctest::add_parity(g);
    ctest::add_serving(g);
    ctest::add_structured(g);
    ctest::add_contract(g);
    ctest::add_fault_tests(g);
    ctest::add_testmodels(g);
    ctest::apply_adjust(cb.file, out, first);
    for (size_t i = first; i < out.size(); ++i)
      if (!seen.insert(out[i].name).second)
        throw Error("{}: test {} is declared twice", cb.file.path, out[i].name);
  }
  return out;
}

}  // namespace touchstone
