#include "touchstone/run/model_support.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "touchstone/model/model_config.h"
#include "touchstone/run/model_facts.h"

namespace touchstone {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::optional<std::string> undeclared_model_support(const BackendLibrary& lib,
                                                    const std::string& gguf_path) {
  const protocol::BackendInfo& info = lib.channel().info();
  if (!info.declares_models) return std::nullopt;
  const std::optional<ModelConfig>& config = model_facts(gguf_path).config;
  if (!config) return std::nullopt;  // the reference cannot describe it: load_model decides
  const ModelConfig& c = *config;
  const std::vector<std::string> archs = split_list(info.architectures);
  if (!contains(archs, c.architecture)) {
    return fmt::format("backend '{}' computes architectures '{}' only; {} needs {}", lib.name(),
                       fmt::join(archs, ","), gguf_path, c.extra_features());
  }
  if (info.model_features == "*") return std::nullopt;
  const std::vector<std::string> have = split_list(info.model_features);
  std::vector<std::string> missing;
  for (const std::string& f : c.feature_names()) {
    if (!contains(have, f)) missing.push_back(fmt::format("{} ({})", feature_description(f), f));
  }
  if (missing.empty()) return std::nullopt;
  return fmt::format("backend '{}' does not compute {} that {} needs", lib.name(),
                     fmt::join(missing, ", "), gguf_path);
}

}  // namespace touchstone
