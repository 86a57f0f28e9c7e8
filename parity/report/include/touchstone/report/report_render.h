// touchstone/report/report_render.h - reports people read, from one or several runs
// (docs/report-format.md):
//   to_html      one self-contained HTML page (inline CSS and SVG, no script, no
//                network): the verdict matrix (backend x model x weight path x
//                case / passage) and per-item plots (KL per step, reference top-2
//                margin with the near-tie band, first failing step marked; KL per
//                position for scoring passages)
//   to_markdown  GitHub-flavoured Markdown for a CI job summary: verdict line,
//                matrix, and per failing item its first divergence (step, tokens, why)
#pragma once

#include <string>
#include <vector>

#include "touchstone/report/report_view.h"

namespace touchstone {

std::string to_html(const std::vector<RunView>& runs);
std::string to_markdown(const std::vector<RunView>& runs);

// The runs' models in first-seen order (reports that could not be read have
// none and are left out of the matrix), and for a model the indices of its
// runs and the names of its items (cases, checks, passages) in first-seen order.
std::vector<std::string> matrix_models(const std::vector<RunView>& runs);
std::vector<size_t> matrix_runs(const std::vector<RunView>& runs, const std::string& model);
std::vector<std::string> matrix_items(const std::vector<RunView>& runs,
                                      const std::vector<size_t>& columns);
// The item called `name` of a run, or nullptr.
const ItemView* find_item(const RunView& run, const std::string& name);
// "PASS", "FAIL", or "FAIL @3" (the first failing step / position).
std::string item_cell(const ItemView& item);

}  // namespace touchstone
