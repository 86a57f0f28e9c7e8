// tokenizer.cpp - byte-level BPE ("gpt2") and SentencePiece-style BPE
// ("llama") tokenizers. See touchstone/model/tokenizer.h for the behaviour.
//
// Sources this follows (behaviour, not code):
//  - Hugging Face tokenizers: pre_tokenizers/byte_level.rs (GPT-2 regex,
//    bytes_char mapping), pre_tokenizers/digits.rs (char::is_numeric),
//    models/bpe/word.rs (merge order: lowest rank, then leftmost), and
//    added_vocabulary.rs (special tokens split first, leftmost-longest).
//  - llama.cpp src/llama-vocab.cpp: llm_tokenizer_bpe (pre-tokenizer regex
//    tables per tokenizer.ggml.pre), llm_tokenizer_spm (score-driven merges,
//    resegment, byte fallback), llama_vocab::impl::tokenize / detokenize.
//  - GPT-2 bytes_to_unicode(): openai/gpt-2 src/encoder.py.
#include "touchstone/model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <queue>
#include <unordered_map>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "touchstone/common/error.h"

namespace touchstone {

// ---------------------------------------------------------------------------
// UTF-8 helpers
// ---------------------------------------------------------------------------
namespace {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when s[i] starts
// no valid sequence. On failure *maximal gets the length of the maximal
// subpart (>= 1) that is replaced by one U+FFFD (Unicode 15, section 3.9,
// "U+FFFD substitution of maximal subparts").
size_t valid_utf8_len(std::string_view s, size_t i, size_t* maximal) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  *maximal = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;  // 0x80..0xC1, 0xF5..0xFF: never valid as a lead byte
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= s.size()) break;
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = (k == 1) ? lo : uint8_t{0x80};
    const uint8_t h = (k == 1) ? hi : uint8_t{0xBF};
    if (b < l || b > h) break;
  }
  if (k == need) return need;
  *maximal = k;
  return 0;
}

// Decodes the (valid) UTF-8 sequence at s[i]; returns its length.
size_t decode_utf8(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  if (i + n > s.size()) n = s.size() - i;  // defensive; input is sanitized
  char32_t v = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) v = (v << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *cp = v;
  return n;
}

size_t utf8_char_len(uint8_t b0) {
  if (b0 < 0x80) return 1;
  if ((b0 & 0xE0) == 0xC0) return 2;
  if ((b0 & 0xF0) == 0xE0) return 3;
  if ((b0 & 0xF8) == 0xF0) return 4;
  return 1;
}

// GPT-2 bytes_to_unicode(): printable bytes map to themselves, the other 68
// bytes to U+0100 + n in byte order.
struct ByteMap {
  std::array<char32_t, 256> to_cp{};
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[static_cast<size_t>(b)] =
          printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_cp[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// "\s" as Unicode White_Space (Oniguruma's \s, used by HF tokenizers):
// U+0009..U+000D, U+0085 and the Z categories (Zs, Zl, Zp).
constexpr std::string_view kWsInClass = "\\t-\\r\\x{85}\\p{Z}";

// Rewrites \s and \S of a regex into explicit White_Space classes.
std::string translate_regex(std::string_view re) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char d = re[i + 1];
      if (d == 's') {
        if (in_class)
          out += kWsInClass;
        else
          (out += "[") += std::string(kWsInClass) + "]";
      } else if (d == 'S') {
        if (in_class)
          throw Error("tokenizer: \\S inside a character class is not supported in regex '{}'", re);
        (out += "[^") += std::string(kWsInClass) + "]";
      } else {
        out += c;
        out += d;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out += c;
  }
  return out;
}

// HF tokenizers' ByteLevel regex (byte_level.rs); llama.cpp's version omits
// the final "|\s+", which only changes how gaps are named, not the pieces.
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct PcreCodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using PcreCode = std::unique_ptr<pcre2_code, PcreCodeDeleter>;

struct PcreMatchDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using PcreMatch = std::unique_ptr<pcre2_match_data, PcreMatchDeleter>;

std::string pcre_error_text(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return std::string(reinterpret_cast<const char*>(buf.data()));
}

using Range = std::pair<size_t, size_t>;  // [begin, end) byte offsets

}  // namespace

std::optional<std::vector<std::string>> pre_tokenizer_regexes(std::string_view pre) {
  // llama.cpp llama-vocab.cpp, llm_tokenizer_bpe constructor.
  if (pre == "gpt2") return std::vector<std::string>{kGpt2Regex};
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
      pre == "codeshell" || pre == "exaone" || pre == "minerva") {
    // = HF Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]
    return std::vector<std::string>{"\\p{N}", kGpt2Regex};
  }
  // Llama 3 (HF tokenizer.json Split regex; llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3, which
  // spells (?i:...) out as [sS] etc. because its engine lacks inline flags; PCRE2 has
  // them, with Unicode case folding as Oniguruma in HF tokenizers).
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "falcon3" ||
      pre == "pixtral") {
    return std::vector<std::string>{
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
  }
  // Qwen2 / Qwen2.5 / Qwen3 (and StableLM 2): the same with single digits
  // (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2).
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2") {
    return std::vector<std::string>{
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
  }
  if (pre == "default" || pre.empty()) {
    return std::vector<std::string>{
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        kGpt2Regex,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    };
  }
  return std::nullopt;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t maximal = 0;
    const size_t n = valid_utf8_len(s, i, &maximal);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += maximal;
    }
  }
  return out;
}

char32_t gpt2_byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

// ---------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------
struct Tokenizer::Impl {
  enum class Kind { Gpt2, Spm };

  TokenizerData d;
  Kind kind = Kind::Gpt2;
  std::vector<TokenType> types;
  std::vector<std::string> bytes;  // decoded bytes per token
  std::unordered_map<std::string, int32_t> text_to_id;

  // Special / added tokens matched on the raw text: per first byte, sorted by
  // length, longest first.
  struct Added {
    std::string text;
    int32_t id;
    bool special;
  };
  std::array<std::vector<Added>, 256> added_by_first;

  // gpt2
  std::vector<PcreCode> regexes;
  std::array<int32_t, 256> byte_token{};  // token of a single mapped byte, -1 if none
  struct MergeInfo {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, MergeInfo> merges;

  // llama
  std::array<int32_t, 256> byte_fallback{};  // <0xXX> token (or raw byte token), -1 if none

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  int32_t n() const { return static_cast<int32_t>(d.tokens.size()); }

  void check_id(int32_t id, std::string_view what) const {
    if (id < 0 || id >= n())
      throw Error("tokenizer: invalid token id {} ({}), vocabulary has {} tokens", id, what, n());
  }

  void build();
  void build_gpt2();
  void build_spm();

  void split_regex(const std::string& text, std::vector<Range>& pieces) const;
  void bpe_piece(const std::string& text, Range r, std::vector<int32_t>& out) const;
  void encode_gpt2_text(const std::string& text, Range r, std::vector<int32_t>& out) const;
  void encode_spm_text(std::string text, std::vector<int32_t>& out) const;
  // One SPM symbol of `text` (bytes [off, off + n), linked list prev / next).
  struct SpmSym {
    size_t off;
    size_t n;
    int32_t prev;
    int32_t next;
  };
  using SpmMerges = std::unordered_map<std::string, std::pair<int32_t, int32_t>>;
  // A merged symbol that is a token is emitted; otherwise it is split back
  // along the merge that built it, down to bytes (<0xXX> fallback, else unk).
  void spm_resegment(const std::string& text, const std::vector<SpmSym>& syms,
                     const SpmMerges& rev_merge, size_t off, size_t len,
                     std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::build() {
  if (d.model == "gpt2")
    kind = Kind::Gpt2;
  else if (d.model == "llama")
    kind = Kind::Spm;
  else
    throw Error("tokenizer: unsupported tokenizer model '{}' (supported: gpt2, llama)", d.model);
  if (d.tokens.empty()) throw Error("tokenizer: empty vocabulary");
  if (d.tokens.size() > static_cast<size_t>(INT32_MAX))
    throw Error("tokenizer: vocabulary too large ({})", d.tokens.size());
  if (!d.token_types.empty() && d.token_types.size() != d.tokens.size())
    throw Error("tokenizer: {} token types for {} tokens", d.token_types.size(), d.tokens.size());
  if (!d.scores.empty() && d.scores.size() != d.tokens.size())
    throw Error("tokenizer: {} scores for {} tokens", d.scores.size(), d.tokens.size());
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos", d.bos},
                          {"eos", d.eos},
                          {"unk", d.unk},
                          {"pad", d.pad}}) {
    if (id < -1 || id >= n())
      throw Error("tokenizer: {} token id {} out of range [0, {})", name, id, n());
  }
  if (d.add_bos && d.bos < 0) throw Error("tokenizer: add_bos is set but there is no bos token id");
  if (d.add_eos && d.eos < 0) throw Error("tokenizer: add_eos is set but there is no eos token id");

  const auto N = d.tokens.size();
  types.resize(N, TokenType::Normal);
  for (size_t i = 0; i < d.token_types.size(); ++i) {
    const int32_t t = d.token_types[i];
    if (t < 0 || t > 6)
      throw Error("tokenizer: token {} ('{}') has unknown token type {}", i, d.tokens[i], t);
    types[i] = static_cast<TokenType>(t);
  }
  text_to_id.reserve(N * 2);
  for (size_t i = 0; i < N; ++i) text_to_id.emplace(d.tokens[i], static_cast<int32_t>(i));

  if (kind == Kind::Gpt2)
    build_gpt2();
  else
    build_spm();

  // Added tokens: Control / Unknown (special) and UserDefined (always matched).
  for (size_t i = 0; i < N; ++i) {
    const TokenType t = types[i];
    const bool special = t == TokenType::Control || t == TokenType::Unknown;
    if (!special && t != TokenType::UserDefined) continue;
    const std::string& s = d.tokens[i];
    if (s.empty()) continue;
    added_by_first[static_cast<uint8_t>(s[0])].push_back({s, static_cast<int32_t>(i), special});
  }
  for (auto& v : added_by_first) {
    std::stable_sort(v.begin(), v.end(),
                     [](const Added& a, const Added& b) { return a.text.size() > b.text.size(); });
  }
}

void Tokenizer::Impl::build_gpt2() {
  auto res = pre_tokenizer_regexes(d.pre);
  if (!res) throw Error("tokenizer: unsupported pre-tokenizer '{}' for model gpt2", d.pre);
  for (const std::string& re : *res) {
    const std::string pattern = translate_regex(re);
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (code == nullptr)
      throw Error("tokenizer: cannot compile pre-tokenizer regex '{}' at offset {}: {}", pattern,
                  off, pcre_error_text(err));
    regexes.emplace_back(code);
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  }

  const ByteMap& bm = byte_map();
  for (size_t b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, bm.to_cp[b]);
    auto it = text_to_id.find(s);
    byte_token[b] = it == text_to_id.end() ? -1 : it->second;
  }

  merges.reserve(d.merges.size() * 2);
  for (size_t i = 0; i < d.merges.size(); ++i) {
    const std::string& m = d.merges[i];
    const size_t sp = m.find(' ', 1);  // as llama.cpp: the left part is never empty
    if (sp == std::string::npos || sp + 1 >= m.size())
      throw Error("tokenizer: merge {} ('{}') is not of the form 'left right'", i, m);
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const auto l = text_to_id.find(left), r = text_to_id.find(right),
               res_it = text_to_id.find(left + right);
    if (l == text_to_id.end() || r == text_to_id.end())
      throw Error("tokenizer: merge {} ('{}') uses a part that is not a token", i, m);
    if (res_it == text_to_id.end())
      throw Error("tokenizer: merge {} ('{}') produces '{}', which is not a token", i, m,
                  left + right);
    // First occurrence wins (rank = first index), as llama.cpp's bpe_ranks.
    merges.emplace(pair_key(l->second, r->second),
                   MergeInfo{static_cast<int32_t>(i), res_it->second});
  }

  bytes.resize(d.tokens.size());
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const std::string& t = d.tokens[i];
    if (types[i] != TokenType::Normal && types[i] != TokenType::Unused &&
        types[i] != TokenType::Undefined) {
      bytes[i] = t;  // Control / UserDefined / Unknown / Byte: stored text
      continue;
    }
    const std::string s = sanitize_utf8(t);
    std::string out;
    for (size_t k = 0; k < s.size();) {
      char32_t cp = 0;
      const size_t len = decode_utf8(s, k, &cp);
      auto it = bm.to_byte.find(cp);
      if (it != bm.to_byte.end())
        out.push_back(static_cast<char>(it->second));
      else
        out.append(s, k, len);  // not in the byte alphabet: keep as UTF-8
      k += len;
    }
    bytes[i] = std::move(out);
  }
}

namespace {
// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  if (h < 0 || l < 0) return -1;
  return h * 16 + l;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (true) {
    const size_t p = s.find(from, i);
    if (p == std::string::npos) break;
    out.append(s, i, p - i);
    out.append(to);
    i = p + from.size();
  }
  out.append(s, i, std::string::npos);
  s = std::move(out);
}
}  // namespace

void Tokenizer::Impl::build_spm() {
  if (d.token_types.empty()) {
    for (size_t i = 0; i < d.tokens.size(); ++i)
      if (parse_byte_token(d.tokens[i]) >= 0) types[i] = TokenType::Byte;
  }
  byte_fallback.fill(-1);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    if (types[i] != TokenType::Byte) continue;
    const int b = parse_byte_token(d.tokens[i]);
    if (b < 0)
      throw Error("tokenizer: byte token {} has text '{}', expected <0xXX>", i, d.tokens[i]);
    if (byte_fallback[static_cast<size_t>(b)] < 0)
      byte_fallback[static_cast<size_t>(b)] = static_cast<int32_t>(i);
  }
  for (size_t b = 0; b < 256;
       ++b) {  // llama.cpp byte_to_token: fall back to the raw byte as a token
    if (byte_fallback[b] >= 0) continue;
    auto it = text_to_id.find(std::string(1, static_cast<char>(b)));
    if (it != text_to_id.end()) byte_fallback[b] = it->second;
  }
  bytes.resize(d.tokens.size());
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const TokenType t = types[i];
    if (t == TokenType::Byte) {
      bytes[i] = std::string(1, static_cast<char>(parse_byte_token(d.tokens[i])));
    } else if (t == TokenType::Normal || t == TokenType::Unused || t == TokenType::Undefined) {
      bytes[i] = d.tokens[i];
      replace_all(bytes[i], "\xE2\x96\x81", " ");  // U+2581 -> space
    } else {
      bytes[i] = d.tokens[i];
    }
  }
}

// Splits each range of `pieces` with every regex in turn; matches and the
// gaps between them both become pieces (HF SplitDelimiterBehavior::Isolated).
void Tokenizer::Impl::split_regex(const std::string& text, std::vector<Range>& pieces) const {
  std::vector<Range> next;
  for (const PcreCode& code : regexes) {
    PcreMatch md(pcre2_match_data_create_from_pattern(code.get(), nullptr));
    if (!md) throw Error("tokenizer: out of memory creating PCRE2 match data");
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const Range& r : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + r.first);
      const size_t len = r.second - r.first;
      size_t pos = 0, last = 0;
      while (pos < len) {
        int rc = pcre2_match(code.get(), subject, len, pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
          rc = pcre2_match(code.get(), subject, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                           md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0)
          throw Error("tokenizer: regex match failed at byte {}: {}", r.first + pos,
                      pcre_error_text(rc));
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // empty match: step over one character
          pos = ms + utf8_char_len(static_cast<uint8_t>(text[r.first + ms]));
          continue;
        }
        if (ms > last) next.emplace_back(r.first + last, r.first + ms);
        next.emplace_back(r.first + ms, r.first + me);
        last = pos = me;
      }
      if (last < len) next.emplace_back(r.first + last, r.second);
    }
    pieces.swap(next);
  }
}

// Byte-level BPE of one pre-tokenized piece (HF models/bpe/word.rs merge_all).
void Tokenizer::Impl::bpe_piece(const std::string& text, Range r, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(r.second - r.first);
  for (size_t i = r.first; i < r.second; ++i) {
    const int32_t id = byte_token[static_cast<uint8_t>(text[i])];
    if (id < 0) continue;  // no token for this byte: dropped, as HF's BPE without unk
    syms.push_back(
        {id, static_cast<int32_t>(syms.size()) - 1, static_cast<int32_t>(syms.size()) + 1, true});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  if (syms.size() == 1) {
    out.push_back(syms[0].id);
    return;
  }

  struct Cand {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t lid;
    int32_t rid;
    int32_t result;
  };
  auto cmp = [](const Cand& a, const Cand& b) {  // min-heap on (rank, left)
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(cmp)> heap(cmp);
  auto try_push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const auto it = merges.find(
        pair_key(syms[static_cast<size_t>(left)].id, syms[static_cast<size_t>(right)].id));
    if (it == merges.end()) return;
    heap.push({it->second.rank, left, right, syms[static_cast<size_t>(left)].id,
               syms[static_cast<size_t>(right)].id, it->second.result});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i)
    try_push(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& L = syms[static_cast<size_t>(c.left)];
    Sym& R = syms[static_cast<size_t>(c.right)];
    if (!L.alive || !R.alive || L.next != c.right || L.id != c.lid || R.id != c.rid)
      continue;  // stale
    L.id = c.result;
    L.next = R.next;
    if (R.next >= 0) syms[static_cast<size_t>(R.next)].prev = c.left;
    R.alive = false;
    try_push(L.prev, c.left);
    try_push(c.left, L.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next)
    out.push_back(syms[static_cast<size_t>(i)].id);
}

void Tokenizer::Impl::encode_gpt2_text(const std::string& text, Range r,
                                       std::vector<int32_t>& out) const {
  std::vector<Range> pieces{r};
  split_regex(text, pieces);
  for (const Range& p : pieces) bpe_piece(text, p, out);
}

// llama.cpp llm_tokenizer_spm_session::tokenize.
void Tokenizer::Impl::encode_spm_text(std::string text, std::vector<int32_t>& out) const {
  replace_all(text, " ", "\xE2\x96\x81");
  if (text.empty()) return;
  using Sym = SpmSym;
  std::vector<Sym> syms;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_char_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(syms.size());
    syms.push_back({off, len, idx - 1, off + len == text.size() ? -1 : idx + 1});
    off += len;
  }
  struct Bigram {
    int32_t left;
    int32_t right;
    float score;
    size_t size;
  };
  auto cmp = [](const Bigram& a, const Bigram& b) {  // highest score first, then leftmost
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
  SpmMerges rev_merge;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Sym& L = syms[static_cast<size_t>(left)];
    const Sym& R = syms[static_cast<size_t>(right)];
    std::string s = text.substr(L.off, L.n + R.n);
    const auto it = text_to_id.find(s);
    if (it == text_to_id.end()) return;
    const float score = d.scores.empty() ? 0.0f : d.scores[static_cast<size_t>(it->second)];
    queue.push({left, right, score, s.size()});
    rev_merge[std::move(s)] = {left, right};
  };
  for (size_t i = 1; i < syms.size(); ++i)
    try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Sym& L = syms[static_cast<size_t>(b.left)];
    Sym& R = syms[static_cast<size_t>(b.right)];
    if (L.n == 0 || R.n == 0 || L.n + R.n != b.size) continue;
    L.n += R.n;
    R.n = 0;
    L.next = R.next;
    if (R.next >= 0) syms[static_cast<size_t>(R.next)].prev = b.left;
    try_add(L.prev, b.left);
    try_add(b.left, L.next);
  }
  for (int32_t i = 0; i != -1; i = syms[static_cast<size_t>(i)].next) {
    const Sym& s = syms[static_cast<size_t>(i)];
    spm_resegment(text, syms, rev_merge, s.off, s.n, out);
  }
}

void Tokenizer::Impl::spm_resegment(const std::string& text, const std::vector<SpmSym>& syms,
                                    const SpmMerges& rev_merge, size_t off, size_t len,
                                    std::vector<int32_t>& out) const {
  const std::string s = text.substr(off, len);
  const auto it = text_to_id.find(s);
  if (it != text_to_id.end()) {
    out.push_back(it->second);
    return;
  }
  const auto p = rev_merge.find(s);
  if (p == rev_merge.end()) {
    for (size_t j = 0; j < len; ++j) {
      const int32_t id = byte_fallback[static_cast<uint8_t>(text[off + j])];
      if (id >= 0)
        out.push_back(id);
      else if (d.unk >= 0)
        out.push_back(d.unk);  // no byte token: unk (or dropped without one)
    }
    return;
  }
  const SpmSym& a = syms[static_cast<size_t>(p->second.first)];
  const SpmSym& b = syms[static_cast<size_t>(p->second.second)];
  // The sub-symbols' lengths may have changed since; rebuild them from offsets.
  const size_t split = b.off - a.off;
  spm_resegment(text, syms, rev_merge, off, split, out);
  spm_resegment(text, syms, rev_merge, off + split, len - split, out);
}

Tokenizer::Tokenizer(TokenizerData data) : impl_(std::make_unique<Impl>()) {
  impl_->d = std::move(data);
  impl_->build();
}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view utf8, bool add_bos,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  const std::string text = sanitize_utf8(utf8);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.d.add_bos) out.push_back(m.d.bos);

  // Fragments: runs of raw text and added tokens (leftmost-longest match).
  bool prev_special = true;  // SPM: prefix a space at the start and after a special token
  auto emit_text = [&](size_t b, size_t e) {
    if (m.kind == Impl::Kind::Gpt2) {
      if (e > b) m.encode_gpt2_text(text, {b, e}, out);
    } else {
      std::string s;
      if (m.d.add_space_prefix && prev_special) s = " ";
      s.append(text, b, e - b);
      m.encode_spm_text(std::move(s), out);
    }
    prev_special = false;
  };
  size_t run = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    for (const Impl::Added& a : m.added_by_first[static_cast<uint8_t>(text[i])]) {
      if (a.special && !parse_special) continue;
      if (text.compare(i, a.text.size(), a.text) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > run) emit_text(run, i);
    out.push_back(hit->id);
    prev_special = true;
    i += hit->text.size();
    run = i;
  }
  if (run < text.size()) emit_text(run, text.size());

  if (add_bos && m.d.add_eos) out.push_back(m.d.eos);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  bool first = true;
  for (size_t pos = 0; pos < ids.size(); ++pos) {
    const int32_t id = ids[pos];
    if (id < 0 || id >= m.n())
      throw Error("tokenizer: cannot decode token id {} at position {}: vocabulary has {} tokens",
                  id, pos, m.n());
    const TokenType t = m.types[static_cast<size_t>(id)];
    if (skip_special && (t == TokenType::Control || t == TokenType::Unknown)) continue;
    std::string_view piece = m.bytes[static_cast<size_t>(id)];
    if (first && m.kind == Impl::Kind::Spm && m.d.add_space_prefix && !piece.empty() &&
        piece[0] == ' ')
      piece.remove_prefix(1);
    first = false;
    out.append(piece);
  }
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id, "token_bytes");
  return impl_->bytes[static_cast<size_t>(id)];
}

int32_t Tokenizer::n_vocab() const { return impl_->n(); }
int32_t Tokenizer::bos() const { return impl_->d.bos; }
int32_t Tokenizer::eos() const { return impl_->d.eos; }
int32_t Tokenizer::unk() const { return impl_->d.unk; }
int32_t Tokenizer::pad() const { return impl_->d.pad; }

TokenType Tokenizer::token_type(int32_t id) const {
  impl_->check_id(id, "token_type");
  return impl_->types[static_cast<size_t>(id)];
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < impl_->n() && impl_->types[static_cast<size_t>(id)] == TokenType::Control;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const auto it = impl_->text_to_id.find(std::string(text));
  if (it == impl_->text_to_id.end()) return std::nullopt;
  return it->second;
}

const TokenizerData& Tokenizer::data() const { return impl_->d; }

}  // namespace touchstone
