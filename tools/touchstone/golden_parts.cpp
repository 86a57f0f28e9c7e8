// golden_parts.cpp - see golden_parts.h.
#include "golden_parts.h"

#include <map>

#include "touchstone/common/error.h"

namespace touchstone::cli {
namespace {

// Where each item name of the parts comes from: (part index, item), one part per name.
template <class Item>
std::map<std::string, std::pair<size_t, const Item*>> index_items(
    const std::vector<GoldenFile>& parts, const std::vector<std::string>& paths,
    const std::vector<Item> GoldenFile::*items) {
  std::map<std::string, std::pair<size_t, const Item*>> out;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (const Item& it : parts[p].*items) {
      const auto [at, fresh] = out.emplace(it.name, std::make_pair(p, &it));
      if (!fresh)
        throw Error("golden --merge: '{}' is in two parts: {} and {}", it.name,
                    paths[at->second.first], paths[p]);
    }
  }
  return out;
}

// The parts' common model and recording provenance, checked.
const ManifestModel& common_model(const Manifest& m, const std::vector<GoldenFile>& parts,
                                  const std::vector<std::string>& paths) {
  const ManifestModel& mm = m.find_model(parts[0].model_name);
  for (size_t p = 0; p < parts.size(); ++p) {
    const GoldenFile& g = parts[p];
    if (g.model_name != mm.name || g.model_sha256 != mm.sha256)
      throw Error("{}: model_name '{}' / model_sha256 {}: not {}'s ({}, sha256 {})", paths[p],
                  g.model_name, g.model_sha256, paths[0], mm.name, mm.sha256);
    if (g.reference_version != parts[0].reference_version ||
        g.reference_revision != parts[0].reference_revision)
      throw Error(
          "{}: recorded by '{}' at revision {}, {} by '{}' at {}: parts must come from one "
          "reference build and revision",
          paths[p], g.reference_version, g.reference_revision, paths[0], parts[0].reference_version,
          parts[0].reference_revision);
  }
  return mm;
}

}  // namespace

GoldenFile merge_golden_parts(const Manifest& m, const std::vector<std::string>& paths,
                              const ManifestModel** mm_out) {
  if (paths.empty()) throw Error("golden --merge: no part files");
  std::vector<GoldenFile> parts;
  for (const std::string& p : paths) parts.push_back(read_golden_file(p));
  const ManifestModel& mm = common_model(m, parts, paths);
  auto cases = index_items(parts, paths, &GoldenFile::cases);
  auto scoring = index_items(parts, paths, &GoldenFile::scoring);
  GoldenFile g;
  g.model_name = mm.name;
  g.model_sha256 = mm.sha256;
  g.reference_version = parts[0].reference_version;
  g.reference_revision = parts[0].reference_revision;
  auto take = [&](auto& index, const std::string& name, auto& into, const char* what) {
    const auto it = index.find(name);
    if (it == index.end())
      throw Error("golden --merge: {} '{}' of model {} is in none of the {} parts", what, name,
                  mm.name, paths.size());
    into.push_back(*it->second.second);
    index.erase(it);
  };
  for (const ManifestCase& c : m.cases)
    if (c.model == mm.name) take(cases, c.name, g.cases, "case");
  for (const ManifestScoring& s : m.scoring)
    if (s.model == mm.name) take(scoring, s.name, g.scoring, "scoring passage");
  for (const auto& rest : {cases.empty() ? std::string() : cases.begin()->first,
                           scoring.empty() ? std::string() : scoring.begin()->first}) {
    if (!rest.empty())
      throw Error("golden --merge: '{}' is not an item of model {} in {}", rest, mm.name, m.path);
  }
  g.format_version = g.needed_format();
  *mm_out = &mm;
  return g;
}

}  // namespace touchstone::cli
