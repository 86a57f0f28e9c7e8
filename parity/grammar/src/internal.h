// internal.h - what the oracle's sources share: the Impl of GrammarVocab, which
// holds XGrammar's TokenizerInfo and GrammarCompiler (XGrammar stays out of the
// public header).
#pragma once

#include <xgrammar/xgrammar.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "touchstone/grammar/oracle.h"

namespace touchstone::grammar {

struct GrammarVocab::Impl {
  explicit Impl(const touchstone::Tokenizer& tok);
  /// Compiles `spec` (cached by XGrammar's compiler); GrammarError naming the case.
  xgrammar::CompiledGrammar compile(const GrammarSpec& spec);

  int32_t n_vocab = 0;
  std::vector<int32_t> stops;  // ascending
  std::vector<uint8_t> text;   // 1: the token is matched as its bytes
  size_t n_text = 0;
  std::vector<uint32_t> text_words;    // mask of the text tokens
  std::vector<uint32_t> allowed_ever;  // mask of the text and stop tokens
  std::unique_ptr<xgrammar::TokenizerInfo> info;
  std::mutex compile_mutex;  // guards compiler (shared by every copy of the vocab)
  std::unique_ptr<xgrammar::GrammarCompiler> compiler;
};

/// XGrammar's message without the "[HH:MM:SS] file.cc:123: " prefix its
/// internal errors carry, and without the trailing newline.
std::string xgrammar_message(const std::exception& e);

}  // namespace touchstone::grammar
