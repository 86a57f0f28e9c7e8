// touchstone/model/tokenizer.h - text <-> token ids, bit-exact with Hugging Face.
//
// Two tokenizer families, selected by GGUF key tokenizer.ggml.model:
//
//  * "gpt2": byte-level BPE (GPT-2, SmolLM2, StarCoder, ...). Pipeline, as in
//    HF tokenizers (pre_tokenizers/byte_level.rs, models/bpe) and llama.cpp
//    (src/llama-vocab.cpp, llm_tokenizer_bpe):
//      1. split off added/special tokens (leftmost-longest match);
//      2. pre-tokenize every remaining text run with a sequence of regexes,
//         each applied "isolated" (matches and gaps both become pieces); the
//         sequence is chosen by tokenizer.ggml.pre (see pre_tokenizer_regexes);
//      3. map each byte of a piece to the GPT-2 bytes_to_unicode() alphabet
//         (openai/gpt-2 encoder.py), look every character up in the vocab and
//         DROP those that have no token (HF's BPE without unk token does this;
//         SmolLM2's vocab lacks a few control bytes, e.g. 0x04);
//      4. apply merges, lowest rank first, leftmost on ties.
//  * "llama": SentencePiece-style BPE as in llama.cpp's llm_tokenizer_spm:
//      spaces -> U+2581 "▁", optional " " prefix (add_space_prefix) at the start
//      of the text and after every special token, greedy merges of adjacent
//      symbols by the score of the merged token (highest first, leftmost on
//      ties), and byte fallback to <0xXX> tokens for symbols that are no token.
//
// Regexes run on PCRE2 with PCRE2_UTF | PCRE2_UCP. "\s" is spelled out as the
// Unicode White_Space set (what Oniguruma, used by HF tokenizers, matches)
// rather than PCRE2's \s, which additionally matches U+180E.
//
// Invalid UTF-8 input never crashes: before tokenization every maximal invalid
// subsequence is replaced by U+FFFD (the WHATWG / Python errors="replace"
// rule). This equals what HF gives for bytes.decode("utf-8", "replace"), which
// is the only way invalid bytes can reach HF (Python str). Text inside special
// tokens is matched on the sanitized text as well.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace touchstone {

/// GGUF token types (tokenizer.ggml.token_type; llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

struct TokenizerData {               // everything read from GGUF tokenizer.ggml.* keys
  std::string model;                 // "gpt2" or "llama"
  std::string pre;                   // pre-tokenizer name, e.g. "smollm", "default"
  std::vector<std::string> tokens;   // token text as stored in GGUF
  std::vector<int32_t> token_types;  // may be empty (then: all Normal, except <0xXX> for "llama")
  std::vector<float> scores;         // may be empty (then all 0; "llama" merges use them)
  std::vector<std::string> merges;   // "a b" pairs, may be empty (needed for "gpt2")
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
};

namespace gguf {
class File;
}

/// Reads the tokenizer.ggml.* keys. Throws touchstone::Error naming file + key
/// when a required key is missing or has the wrong type. Defaults when absent
/// (as llama.cpp's llama_vocab::load): pre "default"; add_bos true for
/// "llama", false otherwise; add_eos false; add_space_prefix true for "llama",
/// false otherwise; special ids -1 (for "llama": bos 1, eos 2, unk 0).
TokenizerData tokenizer_data_from_gguf(const gguf::File& f);

/// The regex sequence used for a byte-level ("gpt2") pre-tokenizer name, or
/// nullopt if unsupported. Supported: "gpt2"; "smollm" and the names llama.cpp
/// gives the same rules ("starcoder", "refact", "command-r", "codeshell",
/// "exaone", "minerva"); "default" (llama.cpp's default sequence).
std::optional<std::vector<std::string>> pre_tokenizer_regexes(std::string_view pre);

class Tokenizer {
 public:
  /// Throws touchstone::Error on inconsistent data: unknown model or
  /// pre-tokenizer, sizes of token_types / scores that differ from tokens,
  /// special ids out of range, a merge line without a separating space or
  /// whose parts / result are not tokens (naming the merge index), an empty
  /// vocabulary. (Duplicate token texts are allowed: find_token / merges use
  /// the first id, as a vocab built in order would.)
  explicit Tokenizer(TokenizerData data);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// Encodes UTF-8 text (invalid UTF-8: see the file comment).
  ///
  /// add_bos has HF's add_special_tokens meaning: when true, a BOS token is
  /// prepended iff data.add_bos is set and an EOS token is appended iff
  /// data.add_eos is set (llama.cpp's add_special). When false nothing is
  /// added. For SmolLM2 (add_bos_token false) both give the same ids, as HF's
  /// tokenizer(text) does.
  ///
  /// parse_special: when true, the text of a Control or UserDefined token
  /// ("<|im_start|>") is mapped to that token, as HF does for added tokens.
  /// When false, Control tokens are tokenized as plain text (HF's
  /// split_special_tokens=True); UserDefined tokens are still matched (HF's
  /// non-special added tokens and llama.cpp behave the same way).
  std::vector<int32_t> encode(std::string_view utf8, bool add_bos = true,
                              bool parse_special = true) const;

  /// Concatenated token bytes (raw bytes; may be invalid UTF-8 if the ids cut
  /// a character). skip_special drops Control tokens (HF skip_special_tokens).
  /// For "llama" with add_space_prefix, one leading space of the first emitted
  /// token is removed (HF Metaspace decoder / llama.cpp detokenize).
  /// Throws touchstone::Error naming the id and its position for an id
  /// outside [0, n_vocab).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  /// Bytes of one token: GPT-2 byte-level decoding for "gpt2" normal tokens,
  /// "▁" -> " " for "llama" normal tokens, the byte for <0xXX> Byte tokens,
  /// the stored text for Control / UserDefined tokens. Throws Error for an
  /// invalid id.
  std::string token_bytes(int32_t id) const;

  int32_t n_vocab() const;
  int32_t bos() const;
  int32_t eos() const;
  int32_t unk() const;
  int32_t pad() const;
  TokenType token_type(int32_t id) const;  // throws Error for an invalid id
  bool is_control(int32_t id) const;       // false for invalid ids
  /// Id of the token whose stored text (as in GGUF) is `text`.
  std::optional<int32_t> find_token(std::string_view text) const;
  const TokenizerData& data() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Replaces every maximal invalid UTF-8 subsequence with U+FFFD (EF BF BD),
/// following the Unicode "best practice" used by WHATWG and Python.
std::string sanitize_utf8(std::string_view s);

/// GPT-2 bytes_to_unicode(): the code point that stands for byte b.
char32_t gpt2_byte_to_codepoint(uint8_t b);

}  // namespace touchstone
