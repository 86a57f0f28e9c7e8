// The verdict matrix both readable reports show: per model, one column per run
// and one row per case / check / passage.
#include <fmt/format.h>

#include <algorithm>

#include "touchstone/report/report_render.h"

namespace touchstone {

std::vector<std::string> matrix_models(const std::vector<RunView>& runs) {
  std::vector<std::string> models;
  for (const RunView& r : runs)  // a report that could not be read names no model
    if (!r.model.empty() && std::find(models.begin(), models.end(), r.model) == models.end())
      models.push_back(r.model);
  return models;
}

std::vector<size_t> matrix_runs(const std::vector<RunView>& runs, const std::string& model) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].model == model) idx.push_back(i);
  return idx;
}

std::vector<std::string> matrix_items(const std::vector<RunView>& runs,
                                      const std::vector<size_t>& columns) {
  std::vector<std::string> names;
  for (size_t c : columns)
    for (const ItemView& it : runs[c].items)
      if (std::find(names.begin(), names.end(), it.name) == names.end()) names.push_back(it.name);
  return names;
}

const ItemView* find_item(const RunView& run, const std::string& name) {
  for (const ItemView& it : run.items)
    if (it.name == name) return &it;
  return nullptr;
}

std::string item_cell(const ItemView& item) {
  if (item.passed) return "PASS";
  if (item.known) return "KNOWN";
  if (item.kind == "not_supported") return "NOT SUPPORTED";
  return item.first_failing >= 0 ? fmt::format("FAIL @{}", item.first_failing) : "FAIL";
}

}  // namespace touchstone
