// touchstone/grammar/oracle.h - the grammar mask oracle: at every decoding step,
// the set of tokens a grammar allows next, computed by XGrammar's C++ core
// (version pinned in ci/xgrammar; docs/structured-output.md#the-oracle).
//
// XGrammar does not appear in this header: a target linking touchstone_grammar
// needs neither its headers nor its flags.
//
// Shapes and conventions, shared by every function below:
//  * Token ids are int32_t in [0, n_vocab), n_vocab = Tokenizer::n_vocab() (the
//    logit row length of the model).
//  * A mask is n_words = ceil(n_vocab / 32) uint32_t words; token i is allowed iff
//    bit (i % 32) of word (i / 32) is set (least significant bit first, XGrammar's
//    own bitmask layout). Bits at and above n_vocab in the last word are always 0.
//  * Tokens are matched by their bytes (Tokenizer::token_bytes): what the token
//    appends to the text in the middle of a sequence (a SentencePiece "▁" is a
//    space, also at the start: nothing is stripped). See GrammarVocab for which
//    tokens take part and which are stop tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/common/error.h"

namespace touchstone {
class Tokenizer;
}

namespace touchstone::grammar {

/// A grammar that does not compile (syntax error, invalid JSON schema, invalid
/// regex, a language no token sequence can enter) or an unknown grammar kind.
/// The message starts with `grammar "<name>" (<kind>): ` and carries XGrammar's
/// own description, which names the line and column of an EBNF error (e.g.
/// `EBNF parser error at line 2, column 7: Expect element, but got ...`).
class GrammarError : public touchstone::Error {
 public:
  using touchstone::Error::Error;
};

/// How GrammarSpec::text is read:
///  * json_schema: a JSON Schema (draft 2020-12 subset XGrammar supports); the
///    output is one JSON value conforming to it, any whitespace between tokens
///    (XGrammar's any_whitespace=true), strict mode (no extra properties or items).
///  * gbnf: llama.cpp's GBNF / XGrammar's EBNF, root rule `root`.
///  * regex: a regular expression the whole output must match (ECMAScript-like,
///    as XGrammar's regex converter reads it).
enum class GrammarKind { json_schema, gbnf, regex };

/// "json_schema", "gbnf" or "regex".
std::string_view grammar_kind_name(GrammarKind kind);
/// The inverse of grammar_kind_name; throws GrammarError naming `name` and the
/// three accepted names for anything else.
GrammarKind parse_grammar_kind(std::string_view name);

struct GrammarSpec {
  GrammarKind kind = GrammarKind::gbnf;
  std::string text;  // the grammar, schema or regex
  std::string name;  // the case name, used in error messages
};

/// One tokenizer's vocabulary as XGrammar sees it (built once per model and
/// shared by every GrammarOracle of it; copies share it, thread-safe to share).
///
/// Which tokens take part:
///  * stop tokens: EOS, plus `<end_of_turn>` when the vocabulary has that token
///    (Gemma 3's end of a chat turn; its EOS is `<eos>`). The mask allows them
///    exactly when the grammar may end (GrammarOracle::can_terminate); accepting
///    one ends the sequence (GrammarOracle::is_terminated).
///  * text tokens: every other token of type Normal, Byte or UserDefined, matched
///    by its bytes. Byte-level BPE ("gpt2", SmolLM2) tokens are byte sequences
///    (a multi-byte UTF-8 character may be split across tokens); SentencePiece
///    ("llama", Gemma 3) `<0xXX>` byte-fallback tokens are the single byte XX.
///  * never allowed: Control tokens other than the stop tokens (BOS, chat
///    markers such as `<|im_start|>`), Unknown, Unused and Undefined tokens, and
///    tokens with no bytes.
class GrammarVocab {
 public:
  /// Throws touchstone::Error when the tokenizer has no EOS token.
  explicit GrammarVocab(const touchstone::Tokenizer& tokenizer);
  ~GrammarVocab();
  GrammarVocab(const GrammarVocab&);
  GrammarVocab& operator=(const GrammarVocab&);

  int32_t n_vocab() const;
  size_t mask_words() const;                        // ceil(n_vocab / 32)
  const std::vector<int32_t>& stop_tokens() const;  // ascending
  bool is_stop(int32_t token) const;                // false outside [0, n_vocab)
  bool is_text(int32_t token) const;                // false outside [0, n_vocab)
  size_t n_text_tokens() const;

 private:
  friend class GrammarOracle;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// The grammar state of one sequence. Not thread-safe; fork() for another
/// sequence that starts from the same state.
class GrammarOracle {
 public:
  /// Compiles the grammar for this vocabulary (XGrammar caches compiled grammars
  /// per GrammarVocab: the same spec compiles once). Throws GrammarError when it
  /// does not compile, or when no token is allowed at the start and the empty
  /// string is not in the language (an empty language, as far as tokens go).
  GrammarOracle(const GrammarVocab& vocab, const GrammarSpec& spec);
  ~GrammarOracle();
  GrammarOracle(GrammarOracle&&) noexcept;
  GrammarOracle& operator=(GrammarOracle&&) noexcept;
  GrammarOracle(const GrammarOracle&) = delete;
  GrammarOracle& operator=(const GrammarOracle&) = delete;

  /// An independent oracle in the same state (the compiled grammar is shared).
  GrammarOracle fork() const;

  const GrammarSpec& spec() const;
  const GrammarVocab& vocab() const;

  /// The allowed set for the next token (layout in the file comment). Empty
  /// (all zero) once a stop token has been accepted.
  std::vector<uint32_t> allowed_mask() const;
  /// The same into `words`; throws std::invalid_argument unless
  /// words.size() == vocab().mask_words().
  void fill_mask(std::span<uint32_t> words) const;
  /// mask_digest(allowed_mask()).
  uint64_t mask_digest() const;
  /// Sets every disallowed logit to -infinity; returns how many tokens are
  /// allowed. Throws std::invalid_argument unless logits.size() == n_vocab.
  size_t apply_mask(std::span<float> logits) const;

  /// Advances by one token. Returns false, with the state unchanged, when the
  /// token is not allowed now (not in allowed_mask(), an id out of range, or any
  /// token after a stop token).
  bool accept(int32_t token);
  /// Undoes the last n_tokens accepted tokens (a stop token counts as one).
  /// Throws std::out_of_range unless 0 <= n_tokens <= n_accepted().
  void rollback(int n_tokens);
  /// Tokens accepted so far (rollback reduces it).
  int n_accepted() const;

  /// The text accepted so far is a complete sentence of the grammar: a stop
  /// token would be accepted now (more text may still be allowed).
  bool can_terminate() const;
  /// can_terminate() and no text token is allowed: only a stop token may follow.
  bool is_completed() const;
  /// A stop token has been accepted.
  bool is_terminated() const;

 private:
  struct Impl;
  explicit GrammarOracle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// True iff token is allowed by `mask` (false outside the mask).
// llama.cpp's GBNF as XGrammar's EBNF: the one difference met in stock grammars,
// an empty alternative ("ws ::= | \" \""), becomes the empty string ""
// (XGrammar: "Expect element, but got |"). Everything else is passed through;
// GrammarKind::gbnf texts go through it before compilation.
std::string gbnf_to_xgrammar(std::string_view gbnf);

bool mask_allows(std::span<const uint32_t> mask, int32_t token);
/// Sets logits[t] to -infinity for every token t the mask does not allow;
/// returns how many it allows. The mask has ceil(logits.size() / 32) words
/// (std::invalid_argument otherwise).
size_t apply_mask(std::span<const uint32_t> mask, std::span<float> logits);
/// Number of allowed tokens (set bits).
size_t mask_count(std::span<const uint32_t> mask);
/// FNV-1a 64 over the mask words, each word taken as its 4 bytes, least
/// significant first (so the digest does not depend on the host's byte order):
/// h = 0xcbf29ce484222325; for each byte b: h = (h ^ b) * 0x100000001b3.
uint64_t mask_digest(std::span<const uint32_t> mask);

/// Logits of the next position. Called first with token_fed = -1 (the logits at
/// the end of the prompt, already prefilled by the caller), then with every
/// token chosen (feed it, return the logits after it). Must return n_vocab
/// values.
using NextLogits = std::function<std::vector<float>(int32_t token_fed)>;

struct ConstrainedResult {
  enum class Stop {
    stop_token,  // a stop token was chosen (it is the last of `tokens`)
    completed,   // the grammar allows nothing but a stop token; none was appended
    max_tokens,  // max_tokens tokens chosen, the grammar not completed
  };
  std::vector<int32_t> tokens;  // the tokens chosen, in order
  Stop stop = Stop::max_tokens;
};

/// Constrained greedy decoding: at every step the argmax of the logits over the
/// tokens the oracle allows (the lowest id on ties; NaN logits never win), fed to
/// the oracle and to next_logits. Stop tokens are allowed only when the grammar
/// may end (the mask's rule). Stops when a stop token is chosen, when the grammar
/// is completed (checked before asking for logits), or after max_tokens tokens.
/// Throws std::invalid_argument for a logits row of the wrong size and
/// GrammarError when no token is allowed while the grammar cannot end (a state
/// XGrammar should never reach).
ConstrainedResult constrained_greedy(GrammarOracle& oracle, const NextLogits& next_logits,
                                     int max_tokens);

}  // namespace touchstone::grammar
