// The HTML report: one self-contained page (inline CSS + SVG, no script, no
// external resources). Every text from a report is escaped (xml_escape).
#include <fmt/format.h>

#include "touchstone/model/tokenizer.h"
#include "touchstone/report/report.h"
#include "touchstone/report/report_render.h"
#include "touchstone/report/svg_plot.h"

namespace touchstone {
namespace {

std::string esc(const std::string& s) { return xml_escape(s); }

constexpr const char* kStyle = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; font-size: 13px; }
td.ts-num { text-align: right; font-variant-numeric: tabular-nums; }
.ts-PASS { background: #c8e6c9; } .ts-FAIL { background: #ffcdd2; }
.ts-KNOWN, .ts-KNOWN_DIVERGENCE { background: #fff59d; }
.ts-SKIP { background: #e0e0e0; } .ts-UNSUPPORTED { background: #ffe0b2; }
.ts-INCOMPLETE, .ts-MISSING, .ts-INVALID { background: #f8bbd0; }
.ts-none { color: #999; }
.ts-verdict { font-size: 18px; font-weight: 600; padding: 8px 12px; display: inline-block; }
.ts-item { border-top: 1px solid #ddd; padding: 8px 0; }
.ts-failures { color: #b71c1c; font-family: ui-monospace, monospace; font-size: 12px; }
.ts-plots { display: flex; flex-wrap: wrap; gap: 12px; }
svg.ts-plot { max-width: 100%; height: auto; background: #fff; }
.ts-plot-area { fill: #fafafa; stroke: #bbb; } .ts-grid { stroke: #e6e6e6; }
.ts-series { fill: none; stroke: #1565c0; stroke-width: 1.5; } .ts-series-point { fill: #1565c0; }
.ts-near-tie-band { fill: #ffecb3; }
.ts-first-divergence { stroke: #c62828; stroke-width: 2; stroke-dasharray: 5 3; }
.ts-mark { fill: none; stroke: #c62828; stroke-width: 1.2; }
.ts-nonfinite { stroke: #c62828; stroke-width: 2; }
.ts-tick { font-size: 10px; fill: #555; } .ts-axis-label { font-size: 11px; fill: #333; }
.ts-plot-title { font-size: 12px; font-weight: 600; fill: #222; }
code { font-size: 12px; }
)";

std::string run_label(const RunView& r) {
  return r.backend + " / " + r.weights + (r.profile.empty() ? "" : " (" + r.profile + ")");
}

std::string item_id(size_t run, size_t item) { return fmt::format("run-{}-item-{}", run, item); }

std::string runs_table(const std::vector<RunView>& runs) {
  std::string o =
      "<table class=\"ts-runs\">\n<tr><th>#</th><th>backend</th><th>device</th><th>model</th>"
      "<th>model sha256</th><th>weights</th><th>profile</th><th>suite</th><th>verdict</th>"
      "<th>checks passed</th><th>time</th><th>touchstone</th><th>started (UTC)</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunView& r = runs[i];
    int passed = 0, checks = 0;  // NOT SUPPORTED items are not checks
    for (const ItemView& it : r.items) {
      passed += it.passed ? 1 : 0;
      checks += it.kind == "not_supported" ? 0 : 1;
    }
    o += fmt::format(
        "<tr><td><a href=\"#run-{}\">{}</a></td><td>{} {}</td><td>{}</td><td>{}</td>"
        "<td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>"
        "<td class=\"ts-cell ts-{}\">{}</td><td class=\"ts-num\">{}/{}</td>"
        "<td class=\"ts-num\">{:.1f} s</td><td><code>{}</code></td><td>{}</td></tr>\n",
        i, i, esc(r.backend), esc(r.backend_version), esc(r.device), esc(r.model),
        esc(r.model_sha256.substr(0, 16)), esc(r.weights), esc(r.profile), esc(r.suite),
        esc(r.verdict), esc(r.verdict), passed, checks, r.seconds, esc(r.revision),
        esc(r.started_at));
    if (!r.reason.empty())
      o += fmt::format("<tr><td></td><td colspan=\"12\">{}</td></tr>\n", esc(r.reason));
  }
  return o + "</table>\n";
}

std::string matrix_table(const std::vector<RunView>& runs, const std::string& model) {
  const std::vector<size_t> cols = matrix_runs(runs, model);
  std::string o = fmt::format(
      "<h3>{}</h3>\n<table class=\"ts-matrix\" data-model=\"{}\">\n"
      "<tr><th>case / passage</th>",
      esc(model), esc(model));
  for (size_t c : cols) o += fmt::format("<th>#{} {}</th>", c, esc(run_label(runs[c])));
  o += "</tr>\n<tr><th>run verdict</th>";
  for (size_t c : cols) {
    o += fmt::format("<td class=\"ts-cell ts-{}\"><a href=\"#run-{}\">{}</a></td>",
                     esc(runs[c].verdict), c, esc(runs[c].verdict));
  }
  o += "</tr>\n";
  for (const std::string& name : matrix_items(runs, cols)) {
    o += fmt::format("<tr><th>{}</th>", esc(name));
    for (size_t c : cols) {
      const ItemView* it = find_item(runs[c], name);
      if (!it) {
        o += "<td class=\"ts-cell ts-none\">—</td>";
        continue;
      }
      const size_t k = size_t(it - runs[c].items.data());
      o += fmt::format(
          "<td class=\"ts-cell ts-{}\" data-item=\"{}\" data-backend=\"{}\" data-weights=\"{}\">"
          "<a href=\"#{}\">{}</a></td>",
          it->passed                    ? "PASS"
          : it->kind == "not_supported" ? "none"
                                        : "FAIL",
          esc(name), esc(runs[c].backend), esc(runs[c].weights), item_id(c, k),
          esc(item_cell(*it)));
    }
    o += "</tr>\n";
  }
  return o + "</table>\n";
}

// A serving check's configurations: the needle's drift in each (docs/serving-checks.md).
std::string drift_table(const RunView& r, const ItemView& it) {
  std::string o = fmt::format(
      "<p>batching: {}; fork: {}</p>\n<table class=\"ts-drift\" data-case=\"{}\">\n"
      "<tr><th>configuration</th><th>size</th><th>rows</th><th>max |Δ|</th><th>NMSE max</th>"
      "<th>bitwise</th></tr>\n",
      esc(r.batching.empty() ? "?" : r.batching), esc(r.fork.empty() ? "?" : r.fork), esc(it.name));
  for (const ItemView::Drift& d : it.drift) {
    o += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.3g}</td><td>{:.3g}</td><td>{}</td></tr>\n",
        esc(d.label), d.size, d.rows, d.max_abs, d.nmse, d.bitwise ? "yes" : "no");
  }
  return o + "</table>\n";
}

std::string item_plots(const RunView& r, size_t run, const ItemView& it) {
  if (it.kind == "serving") return drift_table(r, it);
  if (it.kl.empty()) {
    return it.kind == "consistency" || it.kind == "structured"
               ? ""
               : "<p class=\"ts-none\">no per-step series in this report</p>\n";
  }
  const bool scoring = it.kind == "scoring";
  const std::string unit = scoring ? "position" : "step";
  const std::string where = fmt::format("first failing {} {}", unit, it.first_failing);
  PlotSpec kl;
  kl.css_class = "ts-plot-kl";
  kl.data_case = it.name;
  kl.data_run = std::to_string(run);
  kl.title = fmt::format("KL divergence per {} (nats, log scale)", unit);
  kl.x_label = unit;
  kl.y_label = "KL (nats)";
  kl.log_y = true;
  kl.y = it.kl;
  kl.vline = it.first_failing;
  kl.vline_label = where;
  std::string o = "<div class=\"ts-plots\">\n" + render_svg_plot(kl);
  if (!scoring && !it.margin.empty()) {
    PlotSpec m;
    m.css_class = "ts-plot-margin";
    m.data_case = it.name;
    m.data_run = std::to_string(run);
    m.title = "reference top-2 logit margin per step (log scale; ○ = top-1 differs)";
    m.x_label = "step";
    m.y_label = "margin (logits)";
    m.log_y = true;
    m.y = it.margin;
    if (r.near_tie_margin >= 0) {
      m.band = std::pair{0.0, r.near_tie_margin};
      m.band_label = fmt::format("near-tie band: margin < {}", r.near_tie_margin);
    }
    for (size_t s = 0; s < it.top1_match.size(); ++s)
      if (!it.top1_match[s]) m.marks.push_back(int(s));
    m.vline = it.first_failing;
    m.vline_label = where;
    o += render_svg_plot(m);
  }
  return o + "</div>\n";
}

std::string item_details(const RunView& r, size_t run, size_t k) {
  const ItemView& it = r.items[k];
  const std::string verdict = it.passed                    ? "PASS"
                              : it.known                   ? "KNOWN"
                              : it.kind == "not_supported" ? "none"
                                                           : "FAIL";
  std::string o = fmt::format(
      "<div class=\"ts-item\" id=\"{}\" data-case=\"{}\" data-kind=\"{}\">\n"
      "<h4>{} <span class=\"ts-cell ts-{}\">{}</span> <small>{}: {}/{} {} matched</small></h4>\n",
      item_id(run, k), esc(it.name), esc(it.kind), esc(it.name), verdict, esc(item_cell(it)),
      esc(it.kind), it.matched, it.total, it.kind == "scoring" ? "top-1" : "tokens");
  if (!it.divergence.empty()) {
    o += fmt::format("<p>first differing argmax at step {}: <code>{}</code></p>\n",
                     it.divergence_step, esc(it.divergence));
  }
  if (!it.failures.empty()) {
    o += "<ul class=\"ts-failures\">\n";
    for (const std::string& f : it.failures) o += "<li>" + esc(f) + "</li>\n";
    o += "</ul>\n";
  }
  return o + item_plots(r, run, it) + "</div>\n";
}

std::string run_details(const RunView& r, size_t run) {
  std::string o = fmt::format(
      "<section class=\"ts-run\" id=\"run-{}\">\n<h3>#{} {} — {} <span class=\"ts-cell ts-{}\">"
      "{}</span></h3>\n",
      run, run, esc(run_label(r)), esc(r.model), esc(r.verdict), esc(r.verdict));
  if (!r.source.empty()) o += "<p>report: <code>" + esc(r.source) + "</code></p>\n";
  if (!r.reason.empty()) o += "<p>" + esc(r.reason) + "</p>\n";
  for (size_t k = 0; k < r.items.size(); ++k) o += item_details(r, run, k);
  return o + "</section>\n";
}

}  // namespace

std::string to_html(const std::vector<RunView>& runs) {
  const std::string verdict = overall_verdict(runs);
  std::string o = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>Touchstone parity: {}</title>\n<style>{}</style>\n</head>\n<body>\n"
      "<h1>Touchstone parity report</h1>\n"
      "<p class=\"ts-verdict ts-{}\" id=\"ts-verdict\">verdict: {} ({})</p>\n",
      verdict, kStyle, verdict, verdict, esc(verdict_counts(runs)));
  o += "<h2>Verdict matrix</h2>\n";
  for (const std::string& m : matrix_models(runs)) o += matrix_table(runs, m);
  o += "<h2>Runs</h2>\n" + runs_table(runs);
  o += "<h2>Details</h2>\n";
  for (size_t i = 0; i < runs.size(); ++i) o += run_details(runs[i], i);
  o += "</body>\n</html>\n";
  return sanitize_utf8(o);
}

}  // namespace touchstone
