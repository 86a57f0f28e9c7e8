#include "touchstone/run/model_facts.h"

#include <map>
#include <mutex>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"

namespace touchstone {

const ModelFacts& model_facts(const std::string& gguf_path) {
  static std::mutex mu;
  static std::map<std::string, ModelFacts> cache;  // entries never move or go
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(gguf_path); it != cache.end()) return it->second;
  const gguf::File file = gguf::File::open_metadata(gguf_path);
  ModelFacts facts{chat_template_from_gguf(file), tokenizer_data_from_gguf(file), std::nullopt};
  try {
    facts.config = read_model_config(file);
  } catch (const Error&) {
    // The reference cannot describe it: load_model decides (model_support.h).
  }
  return cache.emplace(gguf_path, std::move(facts)).first->second;
}

}  // namespace touchstone
