#include "readable_reports.h"

#include "touchstone/report/report.h"
#include "touchstone/report/report_render.h"

namespace touchstone::cli {

void add_readable_options(CLI::App& cmd, ReadableOutputs& out) {
  cmd.add_option("--html", out.html,
                 "Write one self-contained HTML page here: verdict matrix and per-case plots "
                 "(docs/report-format.md)");
  cmd.add_option("--summary,--markdown", out.markdown,
                 "Write a GitHub-flavoured Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)");
}

void write_readable_reports(const ReadableOutputs& out, const std::vector<RunView>& runs) {
  if (!out.html.empty()) write_file_atomic(out.html, to_html(runs));
  if (!out.markdown.empty()) write_file_atomic(out.markdown, to_markdown(runs));
}

}  // namespace touchstone::cli
