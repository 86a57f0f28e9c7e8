// backend_file.cpp - backend.json read and checked, and the matrix of parity
// runs the files declare (touchstone/run/backend_file.h).
#include "touchstone/run/backend_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "backend_file_obj.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"

namespace touchstone {
namespace {

namespace fs = std::filesystem;
using backend_file::check_weights;
using backend_file::Obj;
using nlohmann::json;

BackendParityEntry parity_entry(const json& e, const std::string& file, const std::string& ptr) {
  const Obj o{e,
              file,
              ptr,
              {"weights", "tier", "models", "slow_tags", "ci_suite", "profile", "known_divergences",
               "why"}};
  o.check();
  BackendParityEntry p{
      o.str("weights", true),     o.str("tier", true), o.str("profile"),    o.str("ci_suite"),
      o.str("known_divergences"), o.strs("models"),    o.strs("slow_tags"), o.str("why")};
  check_weights(file, ptr, p.weights);
  if (!p.known_divergences.empty())
    p.known_divergences = (fs::path(file).parent_path() / p.known_divergences).string();
  return p;
}

BackendServingEntry serving_entry(const json& e, const std::string& file, const std::string& ptr) {
  const Obj o{e, file, ptr, {"weights", "models", "plan", "labels", "why"}};
  o.check();
  BackendServingEntry s{o.str("weights", true), o.strs("models"), o.str("plan"), o.strs("labels"),
                        o.str("why")};
  check_weights(file, ptr, s.weights);
  if (!s.plan.empty() && s.plan != "smoke" && s.plan != "quick" && s.plan != "full")
    throw Error("{}: {}/plan: '{}' (expected smoke, quick or full)", file, ptr, s.plan);
  return s;
}

void read_matrix(const json& m, const std::string& file, BackendFile& b) {
  const Obj o{m, file, "/matrix", {"start", "serving_plan", "quick", "paths"}};
  o.check();
  b.start = o.integer("start", 0);
  b.serving_plan = o.str("serving_plan");
  if (m.contains("quick")) {
    const Obj q{m["quick"], file, "/matrix/quick", {"suite", "max_steps", "golden_free"}};
    q.check();
    b.quick_suite = q.str("suite");
    b.quick_max_steps = q.integer("max_steps", 0);
    b.golden_free = q.boolean("golden_free", true);
  }
  if (!m.contains("paths") || !m["paths"].is_array())
    throw Error("{}: /matrix/paths: expected an array", file);
  for (size_t i = 0; i < m["paths"].size(); ++i) {
    const std::string ptr = fmt::format("/matrix/paths/{}", i);
    const Obj p{m["paths"][i], file, ptr, {"weights", "models"}};
    p.check();
    b.paths.push_back({p.str("weights", true), p.strs("models")});
    check_weights(file, ptr, b.paths.back().weights);
  }
}

}  // namespace

const BackendParityEntry* BackendFile::parity_for(const std::string& weights) const {
  for (const BackendParityEntry& e : parity)
    if (e.weights == weights) return &e;
  return nullptr;
}

BackendFile read_backend_file(const std::string& path) {
  json j;
  try {
    j = json::parse(fileio::read_file(path, "backend file"));
  } catch (const json::parse_error& e) {
    throw Error("{}: not JSON (byte {}): {}", path, e.byte, e.what());
  }
  const Obj o{j,
              path,
              "",
              {"touchstone_backend", "name", "parity", "serving", "structured", "contract",
               "faults", "testmodels", "adjust", "matrix"}};
  o.check();
  if (o.integer("touchstone_backend", 0) != 1)
    throw Error("{}: /touchstone_backend: expected 1 (the format of docs/backend-file.md)", path);
  BackendFile b;
  b.path = path;
  b.name = o.str("name", true);
  if (!j.contains("parity") || !j["parity"].is_array())
    throw Error("{}: /parity: expected an array", path);
  for (size_t i = 0; i < j["parity"].size(); ++i)
    b.parity.push_back(parity_entry(j["parity"][i], path, fmt::format("/parity/{}", i)));
  if (j.contains("serving") && !j["serving"].is_array())
    throw Error("{}: /serving: expected an array", path);
  for (size_t i = 0; j.contains("serving") && i < j["serving"].size(); ++i) {
    const std::string ptr = fmt::format("/serving/{}", i);
    b.serving.push_back(serving_entry(j["serving"][i], path, ptr));
    if (!b.parity_for(b.serving.back().weights))
      throw Error("{}: {}/weights: '{}' has no /parity entry", path, ptr, b.serving.back().weights);
  }
  backend_file::read_ctest_members(j, path, b);
  if (!j.contains("matrix")) throw Error("{}: /matrix: missing", path);
  read_matrix(j["matrix"], path, b);
  for (const BackendMatrixPath& p : b.paths)
    if (!b.parity_for(p.weights))
      throw Error("{}: /matrix/paths: weights '{}' has no /parity entry", path, p.weights);
  return b;
}

std::vector<BackendFile> find_backend_files(const std::string& root) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(fs::path(root) / "backends", ec))
    if (fs::exists(d.path() / "backend.json"))
      paths.push_back((d.path() / "backend.json").string());
  if (const fs::path r = fs::path(root) / "reference" / "backend" / "backend.json"; fs::exists(r))
    paths.push_back(r.string());
  std::ranges::sort(paths);
  std::vector<BackendFile> out;
  for (const std::string& p : paths) out.push_back(read_backend_file(p));
  return out;
}

namespace {

// The flags of one quick-matrix row (see matrix_rows).
std::vector<std::string> row_args(const BackendFile& b, const BackendMatrixPath& p,
                                  const std::string& model, bool first_model,
                                  const std::vector<std::string>& shared_path_cases,
                                  const std::string& suite) {
  std::vector<std::string> a;
  const bool quick = suite == "quick";
  const auto has_path = [&](const char* w) {
    return std::ranges::any_of(b.paths, [&](const BackendMatrixPath& q) {
      return q.weights == w && (q.models.empty() || std::ranges::count(q.models, model) > 0);
    });
  };
  if (quick && !b.quick_suite.empty() && b.quick_max_steps > 0)
    a.insert(a.end(), {"--max-steps", std::to_string(b.quick_max_steps)});
  if (quick && (!b.golden_free || !first_model ||
                (p.weights == "full_precision" && has_path("quantized")))) {
    a.insert(a.end(), {"--no-serving", "--no-consistency"});
  } else if (quick) {
    a.push_back("--structured");
  }
  if (quick && p.weights == "full_precision" && has_path("quantized"))
    for (const std::string& c : shared_path_cases) a.insert(a.end(), {"--skip-case", c});
  const BackendParityEntry& e = *b.parity_for(p.weights);
  if (!e.known_divergences.empty()) a.insert(a.end(), {"--known-divergences", e.known_divergences});
  if (!b.serving_plan.empty()) a.insert(a.end(), {"--serving-plan", b.serving_plan});
  if (!e.profile.empty()) a.insert(a.end(), {"--profile", e.profile});
  return a;
}

}  // namespace

std::vector<MatrixRow> matrix_rows(const std::vector<BackendFile>& backends,
                                   const std::vector<std::string>& models,
                                   const std::vector<std::string>& shared_path_cases,
                                   const std::string& suite) {
  std::vector<const BackendFile*> order;
  for (const BackendFile& b : backends) order.push_back(&b);
  std::ranges::stable_sort(order, {}, &BackendFile::start);
  std::vector<MatrixRow> rows;
  for (const std::string& model : models) {
    for (const BackendFile* b : order) {
      for (const BackendMatrixPath& p : b->paths) {
        if (!p.models.empty() && std::ranges::count(p.models, model) == 0) continue;
        const std::string s = suite == "quick" && !b->quick_suite.empty() ? b->quick_suite : suite;
        rows.push_back({b->name, p.weights, model, s,
                        row_args(*b, p, model, model == models.front(), shared_path_cases, suite),
                        b->start});
      }
    }
  }
  return rows;
}

}  // namespace touchstone
