// The Markdown report (GitHub-flavoured, for $GITHUB_STEP_SUMMARY and the like).
#include <fmt/format.h>

#include "touchstone/model/tokenizer.h"
#include "touchstone/report/report_render.h"

namespace touchstone {
namespace {

// Text safe in a table cell or list item: no line breaks, Markdown and HTML
// punctuation escaped, long texts cut.
std::string md(const std::string& s, size_t max = 300) {
  std::string o;
  for (char c : sanitize_utf8(s.size() > max ? s.substr(0, max) + "…" : s)) {
    switch (c) {
      case '\n':
      case '\r':
      case '\t':
        o += ' ';
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '|':
      case '\\':
      case '*':
      case '_':
      case '`':
      case '[':
      case ']':
      case '#':
        o += '\\';
        o += c;
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string badge(const std::string& verdict) {
  if (verdict == "PASS") return "✅ PASS";
  if (verdict == "KNOWN_DIVERGENCE" || verdict == "KNOWN") return "🟡 " + verdict;
  if (verdict.starts_with("FAIL")) return "❌ " + verdict;
  if (verdict == "SKIP") return "⏭️ SKIP";
  if (verdict == "UNSUPPORTED") return "⚠️ UNSUPPORTED";
  if (verdict == "NOT SUPPORTED") return "➖ NOT SUPPORTED";
  return "❗ " + md(verdict);
}

std::string runs_table(const std::vector<RunView>& runs) {
  std::string o =
      "| backend | model | weights | profile | suite | verdict | checks passed | time |\n"
      "|---|---|---|---|---|---|--:|--:|\n";
  for (const RunView& r : runs) {
    int passed = 0, checks = 0;  // NOT SUPPORTED items are not checks
    for (const ItemView& it : r.items) {
      passed += it.passed ? 1 : 0;
      checks += it.kind == "not_supported" ? 0 : 1;
    }
    o += fmt::format("| {} | {} | {} | {} | {} | {} | {}/{} | {:.1f} s |\n", md(r.backend),
                     md(r.model), md(r.weights), md(r.profile), md(r.suite), badge(r.verdict),
                     passed, checks, r.seconds);
  }
  return o;
}

std::string matrix_table(const std::vector<RunView>& runs, const std::string& model) {
  const std::vector<size_t> cols = matrix_runs(runs, model);
  std::string o = fmt::format("\n#### {}\n\n| case / passage |", md(model));
  std::string rule = "|---|", verdicts = "| *run verdict* |";
  for (size_t c : cols) {
    o += fmt::format(" {} {} |", md(runs[c].backend), md(runs[c].weights));
    rule += "---|";
    verdicts += " " + badge(runs[c].verdict) + " |";
  }
  o += "\n" + rule + "\n" + verdicts + "\n";
  for (const std::string& name : matrix_items(runs, cols)) {
    o += "| " + md(name) + " |";
    for (size_t c : cols) {
      const ItemView* it = find_item(runs[c], name);
      o += " " + (it ? badge(item_cell(*it)) : std::string("—")) + " |";
    }
    o += "\n";
  }
  return o;
}

std::string failing_item(const RunView& r, const ItemView& it) {
  if (it.kind == "not_supported") {
    return fmt::format("- **{} / {} / {} / {}**: NOT SUPPORTED: {}\n", md(r.backend), md(r.model),
                       md(r.weights), md(it.name), md(it.failures.empty() ? "" : it.failures[0]));
  }
  const char* unit = it.kind == "scoring" ? "position" : "step";
  std::string o = fmt::format("- **{} / {} / {} / {}**: ", md(r.backend), md(r.model),
                              md(r.weights), md(it.name));
  o += it.first_failing >= 0 ? fmt::format("first failing {} {}", unit, it.first_failing)
                             : std::string("no single failing ") + unit;
  if (!it.divergence.empty()) {
    o += fmt::format("; first differing argmax at step {}: {}", it.divergence_step,
                     md(it.divergence));
  }
  o += "\n";
  const size_t shown = std::min<size_t>(it.failures.size(), 4);
  for (size_t i = 0; i < shown; ++i) o += "  - why: " + md(it.failures[i]) + "\n";
  if (it.failures.size() > shown)
    o += fmt::format("  - … and {} more\n", it.failures.size() - shown);
  return o;
}

}  // namespace

std::string to_markdown(const std::vector<RunView>& runs) {
  const std::string verdict = overall_verdict(runs);
  std::string o = fmt::format("### Touchstone parity: {}\n\n**verdict: {}** — {}\n\n",
                              badge(verdict), verdict, verdict_counts(runs));
  for (const std::string& m : matrix_models(runs)) o += matrix_table(runs, m);
  // A heading between the tables: GitHub-flavoured Markdown would read a table
  // right after another as more rows of the first.
  o += "\n#### Runs\n\n" + runs_table(runs);
  std::string failing;
  for (const RunView& r : runs) {
    if (r.model.empty()) {  // MISSING / INVALID: the reason names the file
      failing += fmt::format("- {}: {}\n", md(r.verdict), md(r.reason));
    } else if (r.verdict != "PASS" && r.verdict != "FAIL" && !r.reason.empty()) {
      failing += fmt::format("- **{} / {} / {}**: {}: {}\n", md(r.backend), md(r.model),
                             md(r.weights), md(r.verdict), md(r.reason));
    }
    for (const ItemView& it : r.items)
      if (!it.passed) failing += failing_item(r, it);
  }
  if (!failing.empty()) o += "\n#### Failures and notes\n\n" + failing;
  return o;
}

}  // namespace touchstone
