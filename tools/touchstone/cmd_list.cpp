// touchstone list [--manifest M]: what a manifest holds: its models (sha256
// prefix, file), greedy cases (model, steps, tags), scoring passages (model,
// tokens from the golden, tags) and suites.
#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>

#include "cli_common.h"
#include "touchstone/golden/golden.h"
#include "touchstone/golden/manifest.h"

namespace touchstone::cli {
namespace {

std::string tags_text(const std::vector<std::string>& tags) {
  return tags.empty() ? "-" : fmt::format("{}", fmt::join(tags, ","));
}

// Token counts of every scoring passage, read from the goldens; a golden that
// cannot be read leaves its passages out, with a note saying why.
std::map<std::string, size_t> passage_tokens(const Manifest& m, std::vector<std::string>& notes) {
  std::map<std::string, size_t> tokens;
  for (const ManifestModel& mm : m.models) {
    bool has_passage = false;
    for (const ManifestScoring& s : m.scoring) has_passage |= s.model == mm.name;
    if (!has_passage) continue;
    try {
      const GoldenFile g = read_pinned_golden(m, mm, false);
      for (const GoldenScoring& s : g.scoring) tokens[s.name] = s.token_ids.size();
    } catch (const std::exception& e) {
      notes.push_back(fmt::format("token counts of {}'s passages unknown: {}", mm.name, e.what()));
    }
  }
  return tokens;
}

void print_list(const Manifest& m) {
  fmt::print("models ({}):\n", m.path);
  for (const ManifestModel& mm : m.models) {
    fmt::print("  {:<30} sha256 {}…  {}\n", mm.name, mm.sha256.substr(0, 12),
               mm.path.empty() ? mm.filename : mm.path);
  }
  fmt::print("\ncases:\n  {:<22} {:<30} {:>6}  {}\n", "name", "model", "steps", "tags");
  for (const ManifestCase& c : m.cases) {
    fmt::print("  {:<22} {:<30} {:>6}  {}{}\n", c.name, c.model, c.n_predict, tags_text(c.tags),
               c.chat ? "  [chat template]" : "");
  }
  std::vector<std::string> notes;
  const auto tokens = passage_tokens(m, notes);
  fmt::print("\nscoring passages:\n  {:<22} {:<30} {:>6}  {}\n", "name", "model", "tokens", "tags");
  for (const ManifestScoring& s : m.scoring) {
    const auto it = tokens.find(s.name);
    fmt::print("  {:<22} {:<30} {:>6}  {}\n", s.name, s.model,
               it == tokens.end() ? std::string("?") : std::to_string(it->second),
               tags_text(s.tags));
  }
  fmt::print("\nsuites:\n");
  for (const Suite& s : m.suites) {
    fmt::print("  {:<8} {} cases, {} passages{}\n", s.name, s.cases.size(), s.scoring.size(),
               s.max_steps || s.max_positions
                   ? fmt::format(" (trimmed: {} steps, {} positions)", s.max_steps, s.max_positions)
                   : "");
  }
  for (const std::string& n : notes) fmt::print("\nnote: {}\n", n);
}

}  // namespace

void add_list(CLI::App& app, int& exit_code) {
  auto manifest = std::make_shared<std::string>(checking_manifest_path());
  CLI::App* cmd = app.add_subcommand(
      "list", "The manifest's models (sha256, file), cases and scoring passages (steps, tags)");
  cmd->add_option("--manifest", *manifest, "goldens/manifest.json");
  cmd->callback([manifest, &exit_code] {
    print_list(load_manifest(*manifest));
    exit_code = 0;
  });
}

}  // namespace touchstone::cli
