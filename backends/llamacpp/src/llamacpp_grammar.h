// llamacpp_grammar.h - ABI v7 structured output through llama.cpp's own grammar
// sampler (llama_sampler_init_grammar): the allowed set is what
// llama_sampler_apply leaves finite on a candidate array of every token, a
// token is taken by llama_sampler_accept. docs/backends/llamacpp.md#structured-output.
//
// llama.cpp's grammar sampler cannot go back: the state keeps the tokens it
// accepted and rolls back by replaying the remaining prefix on a clone of the
// freshly parsed grammar. Its accept aborts on a stop token where the grammar
// may not end and throws on any token the grammar does not take, so accept()
// consults the mask first and never hands llama.cpp a refused token.
#pragma once

#include <llama.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "touchstone/abi/backend_adapter.hpp"

namespace touchstone::llamacpp {

struct SamplerFree {
  void operator()(llama_sampler* s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerFree>;

// One sequence's state of a GBNF grammar (root rule "root") on a llama.cpp
// vocabulary. Stop tokens are llama.cpp's end-of-generation tokens
// (llama_vocab_is_eog); after one is accepted nothing is allowed.
class LlamaGrammar final : public touchstone::abi::GrammarState {
 public:
  // `initial`: the freshly parsed grammar, shared (read-only) by every clone.
  LlamaGrammar(const llama_vocab* vocab, std::shared_ptr<const llama_sampler> initial);
  LlamaGrammar& operator=(const LlamaGrammar&) = delete;

  bool accept(int32_t token) override;
  void rollback(int32_t n) override;
  void mask(uint32_t* words, int32_t n_words) const override;
  std::unique_ptr<touchstone::abi::GrammarState> clone() const override;

  // The tokens accepted since the grammar was set.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Whether `token` is in the allowed set now.
  bool allows(int32_t token) const;
  // llama.cpp's exception text when its accept threw on a token its own mask
  // allowed (accept() then returned false, the state unchanged); "" otherwise.
  // Reset by every accept().
  const std::string& last_failure() const { return last_failure_; }

 private:
  LlamaGrammar(const LlamaGrammar& other);  // clone()
  // The sampler for the tokens in tokens_: a clone of the initial grammar
  // with every one of them replayed.
  SamplerPtr replay() const;
  void compute_mask() const;
  bool stopped() const;

  const llama_vocab* vocab_;
  int32_t n_vocab_;
  std::shared_ptr<const llama_sampler> initial_;
  SamplerPtr sampler_;
  std::vector<int32_t> tokens_;
  std::string last_failure_;
  // The allowed set of the current state (TS_MASK_WORDS layout), computed on
  // first use after each change.
  mutable std::vector<uint32_t> mask_;
  mutable bool mask_valid_ = false;
};

// Parses a GBNF grammar for `vocab`. On a grammar llama.cpp refuses: null, and
// `error` holds llama.cpp's parse message (which it prints to stderr; taken
// from there) when there is one.
std::unique_ptr<LlamaGrammar> compile_gbnf(const llama_vocab* vocab, const std::string& text,
                                           std::string& error);

}  // namespace touchstone::llamacpp
