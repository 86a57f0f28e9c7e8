// The JSON report's new fields, its read-back (report_view), the HTML page and
// the Markdown summary: series survive the round trip, non-finite values are
// null, every text is escaped, malformed reports are errors naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "touchstone/common/error.h"
#include "touchstone/report/report.h"
#include "touchstone/report/report_render.h"
#include "touchstone/report/report_view.h"
#include "touchstone/report/svg_plot.h"

namespace touchstone {
namespace {

Report failing_report(const std::string& backend = "cpu_simd") {
  Report r;
  r.info.backend = backend;
  r.info.model_name = "m";
  r.info.model_sha256 = std::string(64, 'a');
  r.info.weight_path = "quantized";
  r.info.touchstone_version = "0.1.0";
  r.info.touchstone_revision = "abc1234";
  r.info.started_at = "2026-01-02T03:04:05Z";
  Profile p;
  p.name = "quantized";
  p.greedy = "tolerance";
  p.near_tie_margin = 0.05;
  r.info.tolerances = p;
  CaseResult c;
  c.name = "narrative";
  c.n_steps = c.n_total = 3;
  c.n_matched = 2;
  c.series = {
      {true, 1.5, 1e-6, 1e-9, 1e-4}, {false, 0.01, NAN, INFINITY, 2e-4}, {true, 2, 3e-6, 0, 0}};
  c.full_row_steps = 2;
  c.first_logit_violation_step = 1;
  c.failures = {"logits diverge at step 1: non-finite"};
  r.cases.push_back(c);
  ScoringResult s;
  s.name = "alice";
  s.passed = true;
  s.stats.n_positions = 2;
  s.series = {{true, 1e-12, 1e-13, 1e-5}, {true, 2e-12, 1e-13, 1e-5}};
  r.scoring.push_back(s);
  r.complete = true;
  r.n_planned = 2;
  return r;
}

TEST(ReportJson, SchemaVersionSeriesAndNullForNonFinite) {
  const auto j = nlohmann::json::parse(to_json(failing_report()));
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_EQ(j["touchstone"]["revision"], "abc1234");
  EXPECT_TRUE(j["finished_at"].is_null());  // not finished
  EXPECT_EQ(j["tolerances"]["near_tie_margin"], 0.05);
  EXPECT_TRUE(j["tolerances"]["kld_mean_max"].is_null());
  const auto& s = j["cases"][0]["series"];
  EXPECT_EQ(s["kl"].size(), 3u);
  EXPECT_TRUE(s["kl"][1].is_null());
  EXPECT_TRUE(s["nmse"][1].is_null());
  EXPECT_EQ(s["top1_match"][1], false);
  EXPECT_EQ(s["full_row_steps"], 2);
  EXPECT_EQ(j["cases"][0]["first_failing_step"], 1);
  EXPECT_EQ(j["cases"][0]["kind"], "greedy");
  EXPECT_EQ(j["scoring"][0]["series"]["kl"].size(), 2u);
}

TEST(ReportJson, FirstFailingStepIsTheEarlierOfLogitsAndUnacceptedFlip) {
  CaseResult c;
  EXPECT_EQ(first_failing_step(c), -1);
  c.first_unaccepted_flip_step = 5;
  EXPECT_EQ(first_failing_step(c), 5);
  c.first_logit_violation_step = 7;
  EXPECT_EQ(first_failing_step(c), 5);
  c.first_logit_violation_step = 2;
  EXPECT_EQ(first_failing_step(c), 2);
}

TEST(ReportView, RoundTripKeepsSeriesAndVerdicts) {
  const RunView v = parse_report_view(to_json(failing_report()), "r.json");
  EXPECT_EQ(v.verdict, "FAIL");
  EXPECT_EQ(v.near_tie_margin, 0.05);
  ASSERT_EQ(v.items.size(), 2u);
  EXPECT_EQ(v.items[0].kind, "greedy");
  EXPECT_EQ(v.items[0].first_failing, 1);
  ASSERT_EQ(v.items[0].kl.size(), 3u);
  EXPECT_TRUE(std::isnan(v.items[0].kl[1]));
  EXPECT_EQ(v.items[1].kind, "scoring");
  EXPECT_TRUE(v.items[1].passed);
}

TEST(ReportView, MalformedReportsNameTheFileAndField) {
  auto j = nlohmann::json::parse(to_json(failing_report()));
  j["cases"][0]["series"]["kl"][2] = "x";
  try {
    parse_report_view(j.dump(), "bad.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bad.json: /cases/0/series/kl/2: expected a number or null");
  }
  j = nlohmann::json::parse(to_json(failing_report()));
  j["backend"].erase("name");
  EXPECT_THROW(parse_report_view(j.dump(), "b.json"), Error);
  EXPECT_THROW(parse_report_view("[1, 2]", "c.json"), Error);
  EXPECT_THROW(parse_report_view("{\"verdict\": ", "d.json"), Error);
}

TEST(ReportView, MissingAndInvalidFilesBecomeRows) {
  const auto dir = std::filesystem::temp_directory_path() / "touchstone_report_view_test";
  std::filesystem::create_directories(dir);
  const std::string bad = (dir / "bad.json").string();
  std::ofstream(bad) << "{\"verdict\": \"PASS\"}";
  EXPECT_EQ(read_report_view((dir / "none.json").string()).verdict, "MISSING");
  const RunView v = read_report_view(bad);
  EXPECT_EQ(v.verdict, "INVALID");
  EXPECT_NE(v.reason.find("bad.json"), std::string::npos) << v.reason;
  EXPECT_EQ(overall_verdict({v}), "FAIL");
  std::filesystem::remove_all(dir);
}

TEST(ReportHtml, EscapesEveryTextAndHasPlots) {
  Report r = failing_report("<script>alert(1)</script>");
  r.cases[0].name = "a\"b<c>&";
  const std::string html = to_html({parse_report_view(to_json(r), "x\"<.json")});
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("data-case=\"a&quot;b&lt;c&gt;&amp;\""), std::string::npos);
  EXPECT_NE(html.find("class=\"ts-plot ts-plot-kl\""), std::string::npos);
  EXPECT_NE(html.find("class=\"ts-plot ts-plot-margin\""), std::string::npos);
  EXPECT_NE(html.find("class=\"ts-near-tie-band\""), std::string::npos);
  EXPECT_NE(html.find("class=\"ts-first-divergence\" data-x=\"1\""), std::string::npos);
  EXPECT_NE(html.find("class=\"ts-nonfinite\""), std::string::npos);  // the NaN KL at step 1
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(ReportMarkdown, VerdictMatrixAndFailureWithCellsEscaped) {
  Report r = failing_report("a|b");
  const std::string md = to_markdown({parse_report_view(to_json(r), "")});
  EXPECT_NE(md.find("**verdict: FAIL**"), std::string::npos) << md;
  EXPECT_NE(md.find("| narrative | ❌ FAIL @1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("a\\|b"), std::string::npos) << md;
  EXPECT_NE(md.find("narrative**: first failing step 1"), std::string::npos) << md;
  EXPECT_NE(md.find("  - why: logits diverge at step 1"), std::string::npos) << md;
  // The runs table comes after the matrix, as a table of its own.
  EXPECT_LT(md.find("| case / passage |"), md.find("\n#### Runs\n\n| backend | model |")) << md;
}

TEST(ReportHeadline, CountsEveryVerdictAndPutsTheMatrixFirst) {
  RunView pass, refused, skipped;
  pass.verdict = "PASS";
  refused.verdict = "UNSUPPORTED";
  skipped.verdict = "SKIP";
  const std::vector<RunView> runs{pass, refused, refused, skipped};
  EXPECT_EQ(overall_verdict(runs), "PASS");
  EXPECT_EQ(verdict_counts(runs), "4 runs: 1 PASS, 2 UNSUPPORTED, 1 SKIP");
  EXPECT_EQ(verdict_counts({pass}), "1 run: 1 PASS");
  const std::string html = to_html({parse_report_view(to_json(failing_report()), "r.json")});
  EXPECT_NE(html.find("verdict: FAIL (1 run: 1 FAIL)"), std::string::npos);
  EXPECT_LT(html.find("<h2>Verdict matrix</h2>"), html.find("<h2>Runs</h2>"));
}

TEST(SvgPlot, EmptyAndDegenerateSeriesStillRender) {
  PlotSpec s;
  s.css_class = "ts-plot-kl";
  s.log_y = true;
  for (const std::vector<double>& y : {std::vector<double>{}, std::vector<double>{0.0},
                                       std::vector<double>{NAN, NAN}, std::vector<double>{5, 5}}) {
    s.y = y;
    const std::string svg = render_svg_plot(s);
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
    EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
  }
}

}  // namespace
}  // namespace touchstone
