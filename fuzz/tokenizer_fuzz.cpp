// libFuzzer target: the tokenizer (model/tokenizer), encode/decode round
// trip. The first input byte picks the tokenizer and flags, the rest is text.
//
//  * byte-level BPE ("gpt2"): the real SmolLM2 vocabulary, loaded once from the
//    GGUF at $TOUCHSTONE_MODEL (default ~/.cache/touchstone/models/...) when it
//    exists, else a small vocabulary built here. decode(encode(text)) must give
//    sanitize_utf8(text) minus the bytes the vocabulary has no token for (the
//    BPE drops those, as HF does).
//  * SentencePiece-style ("llama"), a small vocabulary with byte fallback:
//    decode(encode(text)) must give sanitize_utf8(text) back exactly (texts
//    containing U+2581, which decodes as a space, are not compared).
// Every id must lie in [0, n_vocab); nothing may throw on valid ids.
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"

namespace ts = touchstone;

namespace {

std::string utf8(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string bl(std::string_view s) {  // text in the GPT-2 byte-level alphabet
  std::string out;
  for (char c : s) out += utf8(ts::gpt2_byte_to_codepoint(static_cast<uint8_t>(c)));
  return out;
}

ts::TokenizerData small_gpt2() {
  ts::TokenizerData d;
  d.model = "gpt2";
  d.pre = "smollm";
  d.tokens.push_back("<|im_start|>");
  d.token_types.push_back(3);
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(bl(std::string(1, static_cast<char>(b))));
    d.token_types.push_back(1);
  }
  for (const char* m : {"t h", "th e", "a n", "i n", "an d"}) {
    d.merges.emplace_back(m);
    std::string merged(m);
    merged.erase(merged.find(' '), 1);
    d.tokens.push_back(merged);
    d.token_types.push_back(1);
  }
  d.merges.push_back(bl(" ") + " " + bl("the"));
  d.tokens.push_back(bl(" the"));
  d.token_types.push_back(1);
  d.bos = d.eos = 0;
  return d;
}

ts::TokenizerData small_spm() {
  ts::TokenizerData d;
  d.model = "llama";
  d.pre = "default";
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.token_types = {2, 3, 3};
  d.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    d.tokens.emplace_back(name);
    d.token_types.push_back(6);
    d.scores.push_back(0);
  }
  const char* pieces[] = {"\u2581", "h",       "e",   "l",        "o",          "ll",
                          "he",     "\u2581h", "llo", "\u2581he", "\u2581hello"};
  float score = -1;
  for (const char* p : pieces) {
    d.tokens.emplace_back(p);
    d.token_types.push_back(1);
    d.scores.push_back(score);
    score -= 0.5f;
  }
  d.unk = 0;
  d.bos = 1;
  d.eos = 2;
  d.add_bos = true;
  d.add_space_prefix = true;
  return d;
}

struct Setup {
  std::unique_ptr<ts::Tokenizer> gpt2, spm;
  std::array<bool, 256> dropped{};  // gpt2: bytes without a token of their own
};

Setup make_setup() {
  Setup s;
  const char* env = std::getenv("TOUCHSTONE_MODEL");
  std::string model = env != nullptr ? env : "";
  if (model.empty()) {
    const char* home = std::getenv("HOME");
    model = std::string(home != nullptr ? home : "") +
            "/.cache/touchstone/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (::access(model.c_str(), R_OK) == 0) {
    s.gpt2 =
        std::make_unique<ts::Tokenizer>(ts::tokenizer_data_from_gguf(ts::gguf::File::open(model)));
    std::fprintf(stderr, "tokenizer_fuzz: vocabulary of %s (%d tokens)\n", model.c_str(),
                 s.gpt2->n_vocab());
  } else {
    s.gpt2 = std::make_unique<ts::Tokenizer>(small_gpt2());
    std::fprintf(stderr, "tokenizer_fuzz: %s not found, small built-in vocabulary\n",
                 model.c_str());
  }
  for (int b = 0; b < 256; ++b)
    s.dropped[b] = !s.gpt2->find_token(bl(std::string(1, static_cast<char>(b)))).has_value();
  s.spm = std::make_unique<ts::Tokenizer>(small_spm());
  return s;
}

void check_ids(const ts::Tokenizer& t, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= t.n_vocab()) {
      std::fprintf(stderr, "id %d outside [0, %d)\n", id, t.n_vocab());
      std::abort();
    }
}

void mismatch(const std::string& want, const std::string& got) {
  std::fprintf(stderr, "round trip mismatch: want %zu bytes, got %zu bytes\n", want.size(),
               got.size());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Setup setup = make_setup();
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool use_spm = (flags & 1) != 0;
  const bool parse_special = (flags & 2) != 0;
  const bool add_bos = (flags & 4) != 0;
  const ts::Tokenizer& t = use_spm ? *setup.spm : *setup.gpt2;

  // Any flags: valid ids, decode works on them.
  const std::vector<int32_t> any = t.encode(text, add_bos, parse_special);
  check_ids(t, any);
  (void)t.decode(any, (flags & 8) != 0);

  // Round trip (no BOS; special tokens decode to their own text).
  const std::string clean = ts::sanitize_utf8(text);
  if (use_spm) {
    if (parse_special || clean.find("\u2581") != std::string::npos) return 0;
    const std::string got = t.decode(t.encode(text, false, false));
    if (got != clean) mismatch(clean, got);
  } else {
    std::string want;
    for (char c : clean)
      if (!setup.dropped[static_cast<uint8_t>(c)]) want += c;
    const std::string got = t.decode(t.encode(text, false, parse_special));
    if (got != want) mismatch(want, got);
  }
  return 0;
}
