// --html FILE and --summary FILE of `touchstone parity` and `touchstone summary`:
// the HTML page and the Markdown summary of one or several runs, written atomically.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "touchstone/report/report_view.h"

namespace touchstone::cli {

struct ReadableOutputs {
  std::string html;      // "" = not asked for
  std::string markdown;  // "" = not asked for
  bool any() const { return !html.empty() || !markdown.empty(); }
};

// Adds --html and --summary (alias --markdown) to `cmd`.
void add_readable_options(CLI::App& cmd, ReadableOutputs& out);

void write_readable_reports(const ReadableOutputs& out, const std::vector<RunView>& runs);

}  // namespace touchstone::cli
