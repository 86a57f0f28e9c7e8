// vocab.cpp - GrammarVocab: a touchstone::Tokenizer as XGrammar's TokenizerInfo
// (raw token bytes, VocabType::RAW) plus the compiler that caches grammars for it.
#include <algorithm>
#include <stdexcept>
#include <thread>

#include "internal.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone::grammar {

namespace {

// Stop tokens: EOS, and Gemma 3's end of turn when the vocabulary has it.
std::vector<int32_t> stop_tokens_of(const touchstone::Tokenizer& tok) {
  if (tok.eos() < 0) throw touchstone::Error("grammar vocabulary: the tokenizer has no EOS token");
  std::vector<int32_t> stops{tok.eos()};
  if (const auto eot = tok.find_token("<end_of_turn>")) stops.push_back(*eot);
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  return stops;
}

bool takes_part_as_text(const touchstone::Tokenizer& tok, int32_t id) {
  switch (tok.token_type(id)) {
    case TokenType::Normal:
    case TokenType::Byte:
    case TokenType::UserDefined:
      return true;
    default:
      return false;
  }
}

int compiler_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(n, 1u, 8u));
}

}  // namespace

GrammarVocab::Impl::Impl(const touchstone::Tokenizer& tok)
    : n_vocab(tok.n_vocab()), stops(stop_tokens_of(tok)), text(size_t(tok.n_vocab()), 0) {
  // Every id gets an entry: XGrammar treats an empty entry that is not a stop
  // token as special (never allowed as text); stop tokens are empty too, their
  // bytes never take part in matching.
  std::vector<std::string> encoded(static_cast<size_t>(n_vocab));
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (std::binary_search(stops.begin(), stops.end(), id)) continue;
    if (!takes_part_as_text(tok, id)) continue;
    std::string bytes = tok.token_bytes(id);
    if (bytes.empty()) continue;
    encoded[size_t(id)] = std::move(bytes);
    text[size_t(id)] = 1;
    ++n_text;
  }
  text_words.assign((size_t(n_vocab) + 31) / 32, 0u);
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (text[size_t(id)]) text_words[size_t(id) / 32] |= 1u << (id % 32);
  }
  allowed_ever = text_words;
  for (int32_t id : stops) allowed_ever[size_t(id) / 32] |= 1u << (id % 32);
  info = std::make_unique<xgrammar::TokenizerInfo>(encoded, xgrammar::VocabType::RAW, n_vocab,
                                                   stops, /*add_prefix_space=*/false);
  compiler = std::make_unique<xgrammar::GrammarCompiler>(*info, compiler_threads(),
                                                         /*cache_enabled=*/true);
}

GrammarVocab::GrammarVocab(const touchstone::Tokenizer& tokenizer)
    : impl_(std::make_shared<Impl>(tokenizer)) {}
GrammarVocab::~GrammarVocab() = default;
GrammarVocab::GrammarVocab(const GrammarVocab&) = default;
GrammarVocab& GrammarVocab::operator=(const GrammarVocab&) = default;

int32_t GrammarVocab::n_vocab() const { return impl_->n_vocab; }
size_t GrammarVocab::mask_words() const { return (size_t(impl_->n_vocab) + 31) / 32; }
const std::vector<int32_t>& GrammarVocab::stop_tokens() const { return impl_->stops; }
size_t GrammarVocab::n_text_tokens() const { return impl_->n_text; }

bool GrammarVocab::is_stop(int32_t token) const {
  return std::binary_search(impl_->stops.begin(), impl_->stops.end(), token);
}

bool GrammarVocab::is_text(int32_t token) const {
  return token >= 0 && token < impl_->n_vocab && impl_->text[size_t(token)] != 0;
}

}  // namespace touchstone::grammar
