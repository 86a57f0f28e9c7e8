// Stale-golden check: the manifest against what the golden recorded.
#include "touchstone/harness/stale.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "touchstone/common/error.h"
#include "touchstone/harness/recorder.h"

namespace touchstone {

namespace {

// Escaped, shortened excerpt of `s` around byte `at`.
std::string excerpt(const std::string& s, size_t at) {
  constexpr size_t kBefore = 20, kLen = 60;
  const size_t from = at > kBefore ? at - kBefore : 0;
  std::string out = from > 0 ? "..." : "";
  for (size_t i = from; i < s.size() && i < from + kLen; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '"' || c == '\\')
      out += fmt::format("\\{}", static_cast<char>(c));
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (from + kLen < s.size()) out += "...";
  return out;
}

std::string text_diff(const std::string& golden, const std::string& manifest) {
  const auto mismatch =
      std::mismatch(golden.begin(), golden.end(), manifest.begin(), manifest.end());
  const auto at = static_cast<size_t>(mismatch.first - golden.begin());
  return fmt::format(
      "first difference at byte {} of {} (golden) / {} (manifest): golden \"{}\", "
      "manifest \"{}\"",
      at, golden.size(), manifest.size(), excerpt(golden, at), excerpt(manifest, at));
}

bool iequals(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

void check_case(const ManifestCase& c, const GoldenFile& g, const ChatTemplate& chat,
                std::vector<std::string>& out) {
  const GoldenCase* gc = g.find_case(c.name);
  if (gc == nullptr) {
    out.push_back(
        fmt::format("stale golden: case '{}' is in the manifest but not in the golden", c.name));
    return;
  }
  if (gc->chat != c.chat)
    out.push_back(
        fmt::format("stale golden: case '{}': chat is {} in the manifest, {} in the golden", c.name,
                    c.chat, gc->chat));
  const std::string prompt = case_prompt_text(c, chat);
  if (gc->prompt_text != prompt)
    out.push_back(fmt::format("stale golden: case '{}': prompt differs from the manifest ({})",
                              c.name, text_diff(gc->prompt_text, prompt)));
  if (gc->grammar_kind != c.grammar.kind)
    out.push_back(
        fmt::format("stale golden: case '{}': grammar kind is '{}' in the manifest, '{}' "
                    "in the golden",
                    c.name, c.grammar.kind, gc->grammar_kind));
  else if (gc->grammar_text != c.grammar.text)
    out.push_back(fmt::format("stale golden: case '{}': grammar differs from the manifest ({})",
                              c.name, text_diff(gc->grammar_text, c.grammar.text)));
  if (gc->has_image() != c.has_image())
    out.push_back(fmt::format("stale golden: case '{}': {} in the manifest, {} in the golden",
                              c.name, c.has_image() ? "an image" : "no image",
                              gc->has_image() ? "an image" : "none"));
  else if (c.has_image() &&
           (gc->image_sha256 != c.image.sha256 || gc->mmproj_sha256 != c.image.mmproj_sha256))
    out.push_back(fmt::format(
        "stale golden: case '{}': the golden's image / mmproj sha256 ({} / {}) differ from the "
        "manifest's ({} / {})",
        c.name, gc->image_sha256, gc->mmproj_sha256, c.image.sha256, c.image.mmproj_sha256));
  // A constrained continuation may end before n_predict (a stop token, or the
  // grammar complete); an unconstrained one has exactly n_predict steps.
  const size_t G = gc->greedy_ids.size(), N = static_cast<size_t>(c.n_predict);
  if (c.has_grammar() ? G > N : G != N)
    out.push_back(fmt::format(
        "stale golden: case '{}': n_predict is {} in the manifest, the golden has {} greedy steps",
        c.name, c.n_predict, G));
}

}  // namespace

std::vector<std::string> stale_golden_reasons(const Manifest& manifest, const ManifestModel& model,
                                              const GoldenFile& g, const ChatTemplate& chat,
                                              const std::vector<std::string>* only) {
  auto selected = [&](const std::string& name) {
    return only == nullptr || std::find(only->begin(), only->end(), name) != only->end();
  };
  std::vector<std::string> out;
  if (g.model_name != model.name)
    out.push_back(fmt::format("stale golden: recorded for model '{}', the manifest model is '{}'",
                              g.model_name, model.name));
  if (!iequals(g.model_sha256, model.sha256))
    out.push_back(fmt::format(
        "stale golden: recorded from a model with sha256 {}, the manifest pins {} for '{}'",
        g.model_sha256, model.sha256, model.name));
  for (const ManifestCase& c : manifest.cases)
    if (c.model == model.name && selected(c.name)) check_case(c, g, chat, out);
  for (const ManifestScoring& s : manifest.scoring) {
    if (s.model != model.name || !selected(s.name)) continue;
    const GoldenScoring* gs = g.find_scoring(s.name);
    if (gs == nullptr)
      out.push_back(fmt::format(
          "stale golden: scoring passage '{}' is in the manifest but not in the golden", s.name));
    else if (gs->text != s.text)
      out.push_back(fmt::format("stale golden: scoring passage '{}': text differs from {} ({})",
                                s.name, s.text_file, text_diff(gs->text, s.text)));
  }
  return out;
}

void require_fresh_golden(const Manifest& manifest, const ManifestModel& model, const GoldenFile& g,
                          const ChatTemplate& chat, const std::vector<std::string>* only) {
  const std::vector<std::string> reasons = stale_golden_reasons(manifest, model, g, chat, only);
  if (reasons.empty()) return;
  std::string list;
  for (const std::string& r : reasons) list += "\n  " + r;
  throw Error(
      "{}: the golden does not match {} ({} difference{}):{}\nre-record with "
      "`touchstone golden --manifest {}`",
      manifest.resolve(model.golden), manifest.path, reasons.size(), reasons.size() == 1 ? "" : "s",
      list, manifest.path);
}

}  // namespace touchstone
