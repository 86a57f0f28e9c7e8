// reference_grammar.h - the reference backend's own grammar enforcement (ABI v7
// structured output): the oracle of parity/grammar (XGrammar's C++ core) behind
// touchstone::abi::GrammarState, plus the four structured-output faults of the
// catalog (touchstone/model/faults.h), which exist only here.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/model/faults.h"

namespace touchstone::reference_backend {

struct GrammarTables;  // the model's vocabulary as the oracle reads it

// One model's grammar vocabulary, built on the first grammar (Gemma 3's
// 262,144 tokens take a moment) from the GGUF's tokenizer; shared by its sessions.
class GrammarVocabulary {
 public:
  explicit GrammarVocabulary(std::string gguf_path) : path_(std::move(gguf_path)) {}
  std::shared_ptr<const GrammarTables> get();

 private:
  std::string path_;
  std::mutex mu_;
  std::shared_ptr<const GrammarTables> tables_;
};

// Compiles g for the vocabulary (TS_ERR_INVALID_ARGUMENT with the oracle's
// message when it does not compile or its language is empty).
std::unique_ptr<abi::GrammarState> compile_grammar(std::shared_ptr<const GrammarTables> tables,
                                                   const ts_grammar& g, const Faults& faults);

}  // namespace touchstone::reference_backend
