// tokenizer_test.cpp - byte-level BPE ("gpt2") tests.
//
//  * Tiny hand-built vocabularies: merge order, pre-tokenizers, special
//    tokens, dropped bytes, constructor errors, invalid ids. Always run.
//  * SmolLM2-135M-Instruct (env TOUCHSTONE_MODEL, set by CTest from the CMake
//    cache variable TOUCHSTONE_MODEL_PATH): every string of
//    tests/data/hf_token_ids.json (made by gen_hf_ids.py with HF tokenizers)
//    must give HF's ids and decode back. Skipped when the model is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/tokenizer.h"
#if TOUCHSTONE_TOKENIZER_HAVE_GGUF
#include "touchstone/model/gguf.h"
#endif

namespace ts = touchstone;
using Ids = std::vector<int32_t>;

namespace {

// GPT-2 byte-level spelling of a UTF-8/byte string (each byte -> its code point).
std::string bl(std::string_view raw) {
  std::string out;
  for (unsigned char c : raw) {
    const char32_t cp = ts::gpt2_byte_to_codepoint(c);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// Tiny byte-level vocabulary:
//  0 <|eot|> (control)  1 a  2 b  3 c  4 Ġ(space)  5 ab  6 abc  7 Ġa  8 1  9 2
// 10 12  11 !  12 <tool> (user-defined)  13 Ċ(\n)  14 ĠĠ
ts::TokenizerData tiny_gpt2(std::string pre = "gpt2") {
  ts::TokenizerData d;
  d.model = "gpt2";
  d.pre = std::move(pre);
  d.tokens = {"<|eot|>", "a", "b",  "c", bl(" "),  "ab",     "abc",   bl(" a"),
              "1",       "2", "12", "!", "<tool>", bl("\n"), bl("  ")};
  d.token_types = {3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1};
  d.merges = {"a b", "ab c", bl(" ") + " a", "1 2", bl(" ") + " " + bl(" ")};
  d.bos = 0;
  d.eos = 0;
  return d;
}

}  // namespace

TEST(Gpt2ByteMap, MatchesGpt2BytesToUnicode) {
  EXPECT_EQ(ts::gpt2_byte_to_codepoint('A'), U'A');
  EXPECT_EQ(ts::gpt2_byte_to_codepoint(' '), U'\u0120');   // Ġ
  EXPECT_EQ(ts::gpt2_byte_to_codepoint('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(ts::gpt2_byte_to_codepoint(0), U'\u0100');
  EXPECT_EQ(ts::gpt2_byte_to_codepoint(0xAD), U'\u0143');  // soft hyphen is not "printable"
  EXPECT_EQ(ts::gpt2_byte_to_codepoint(0xFF), U'\u00FF');
}

TEST(SanitizeUtf8, ReplacesMaximalSubparts) {
  EXPECT_EQ(ts::sanitize_utf8("abc"), "abc");
  EXPECT_EQ(ts::sanitize_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(ts::sanitize_utf8("a\xFF"
                              "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(ts::sanitize_utf8("\xE2\x82"), "\xEF\xBF\xBD");  // truncated: one U+FFFD
  EXPECT_EQ(ts::sanitize_utf8("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");                     // surrogate
  EXPECT_EQ(ts::sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(ts::sanitize_utf8("\xF0\x9F\x98"
                              "x"),
            "\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(ts::sanitize_utf8(std::string("\0", 1)), std::string("\0", 1));
}

TEST(TinyGpt2, MergesLowestRankFirst) {
  ts::Tokenizer t(tiny_gpt2());
  EXPECT_EQ(t.encode("abc"), (Ids{6}));
  // " abc": pairs (Ġ,a) rank 2 and (a,b) rank 0 -> a+b first, then ab+c;
  // Ġ+abc is no merge, so Ġa (id 7) never forms.
  EXPECT_EQ(t.encode(" abc"), (Ids{4, 6}));
  EXPECT_EQ(t.encode(" a"), (Ids{7}));
  EXPECT_EQ(t.encode("abc abc"), (Ids{6, 4, 6}));
  EXPECT_EQ(t.decode(Ids{6, 4, 6}), "abc abc");
  EXPECT_EQ(t.token_bytes(7), " a");
  EXPECT_EQ(t.token_bytes(13), "\n");
}

TEST(TinyGpt2, WhitespaceRunsFollowGpt2Regex) {
  ts::Tokenizer t(tiny_gpt2());
  // "a   b": \s+(?!\S) takes two spaces, " b" is the next piece -> ĠĠ, Ġ, b
  EXPECT_EQ(t.encode("a   b"), (Ids{1, 14, 4, 2}));
  EXPECT_EQ(t.encode("a  "), (Ids{1, 14}));
  EXPECT_EQ(t.encode("\n"), (Ids{13}));
}

TEST(TinyGpt2, DigitsSplitDependsOnPreTokenizer) {
  ts::Tokenizer gpt2(tiny_gpt2("gpt2"));
  ts::Tokenizer smollm(tiny_gpt2("smollm"));
  EXPECT_EQ(gpt2.encode("a12"), (Ids{1, 10}));      // " ?\p{N}+" keeps "12" together
  EXPECT_EQ(smollm.encode("a12"), (Ids{1, 8, 9}));  // Digits(individual_digits) first
  EXPECT_EQ(gpt2.encode("a 12"), (Ids{1, 4, 10}));  // " 12" -> Ġ has no merge with 1
  EXPECT_EQ(smollm.encode("a 12"), (Ids{1, 4, 8, 9}));
}

TEST(TinyGpt2, Llama3AndQwen2PreTokenizers) {
  ts::Tokenizer llama3(tiny_gpt2("llama-bpe"));
  ts::Tokenizer qwen2(tiny_gpt2("qwen2"));
  EXPECT_EQ(llama3.encode("a12"), (Ids{1, 10}));      // \p{N}{1,3}: "12" together
  EXPECT_EQ(qwen2.encode("a12"), (Ids{1, 8, 9}));     // \p{N}: one digit per piece
  EXPECT_EQ(llama3.encode("a 12"), (Ids{1, 4, 10}));  // the space is its own piece
  EXPECT_EQ(qwen2.encode("a 12"), (Ids{1, 4, 8, 9}));
  EXPECT_EQ(llama3.encode("!a"), (Ids{11, 1}));          // "!a": [^\r\n\p{L}\p{N}]?\p{L}+ -> "!a"
  EXPECT_EQ(llama3.encode("ab\n\n"), (Ids{5, 13, 13}));  // \s*[\r\n]+ keeps the newlines
  EXPECT_THROW(ts::Tokenizer(tiny_gpt2("no-such-pre")), touchstone::Error);
}

TEST(TinyGpt2, BytesWithoutTokenAreDropped) {
  ts::Tokenizer t(tiny_gpt2());
  EXPECT_EQ(t.encode("a\x01"
                     "b"),
            (Ids{1, 2}));  // as HF's BPE without unk token
  EXPECT_EQ(t.encode("!\x01!"), (Ids{11, 11}));
  EXPECT_EQ(t.encode("\x01\x02"), (Ids{}));
}

TEST(TinyGpt2, SpecialAndUserDefinedTokens) {
  ts::Tokenizer t(tiny_gpt2());
  EXPECT_EQ(t.encode("a<|eot|>b"), (Ids{1, 0, 2}));
  EXPECT_EQ(t.encode("a<tool>b"), (Ids{1, 12, 2}));
  // parse_special=false: control tokens are text, user-defined still match
  EXPECT_EQ(t.encode("<|eot|>", true, false), (Ids{}));  // '<', '|', ... have no tokens here
  EXPECT_EQ(t.encode("a<tool>b", true, false), (Ids{1, 12, 2}));
  EXPECT_TRUE(t.is_control(0));
  EXPECT_FALSE(t.is_control(12));
  EXPECT_FALSE(t.is_control(-1));
  EXPECT_FALSE(t.is_control(1000));
  EXPECT_EQ(t.decode(Ids{1, 0, 12, 2}), "a<|eot|><tool>b");
  EXPECT_EQ(t.decode(Ids{1, 0, 12, 2}, true), "a<tool>b");
  EXPECT_EQ(t.find_token("<tool>"), 12);
  EXPECT_EQ(t.find_token(bl(" a")), 7);
  EXPECT_FALSE(t.find_token("zzz").has_value());
}

TEST(TinyGpt2, AddBosFollowsData) {
  auto d = tiny_gpt2();
  d.add_bos = true;
  d.add_eos = true;
  ts::Tokenizer t(d);
  EXPECT_EQ(t.encode("a"), (Ids{0, 1, 0}));
  EXPECT_EQ(t.encode("a", false), (Ids{1}));
  ts::Tokenizer t2(tiny_gpt2());  // add_bos false in the data: nothing is added
  EXPECT_EQ(t2.encode("a", true), (Ids{1}));
  EXPECT_EQ(t2.encode(""), (Ids{}));
}

TEST(TinyGpt2, ConstructorRejectsInconsistentData) {
  auto expect_error = [](ts::TokenizerData d, const std::string& needle) {
    try {
      ts::Tokenizer t(std::move(d));
      ADD_FAILURE() << "no error, expected one containing '" << needle << "'";
    } catch (const ts::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto d = tiny_gpt2();
  d.model = "bert";
  expect_error(d, "unsupported tokenizer model 'bert'");
  d = tiny_gpt2("no-such-pre");
  expect_error(d, "unsupported pre-tokenizer 'no-such-pre'");
  d = tiny_gpt2();
  d.merges.push_back("abc");
  expect_error(d, "merge 5 ('abc')");
  d = tiny_gpt2();
  d.merges.push_back("c c");
  expect_error(d, "merge 5 ('c c') produces 'cc'");
  d = tiny_gpt2();
  d.merges.insert(d.merges.begin(), "x y");
  expect_error(d, "merge 0 ('x y')");
  d = tiny_gpt2();
  d.token_types.pop_back();
  expect_error(d, "token types");
  d = tiny_gpt2();
  d.eos = 99;
  expect_error(d, "eos token id 99");
  d = tiny_gpt2();
  d.tokens.clear();
  d.token_types.clear();
  expect_error(d, "empty vocabulary");
}

TEST(TinyGpt2, InvalidIdsNameIdAndPosition) {
  ts::Tokenizer t(tiny_gpt2());
  try {
    (void)t.decode(Ids{1, 2, 15});
    FAIL() << "expected an error";
  } catch (const ts::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("15"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)t.decode(Ids{-1}), ts::Error);
  EXPECT_THROW((void)t.token_bytes(-5), ts::Error);
  EXPECT_THROW((void)t.token_bytes(15), ts::Error);
  EXPECT_THROW((void)t.token_type(15), ts::Error);
}

TEST(TinyGpt2, InvalidUtf8NeverCrashes) {
  ts::Tokenizer t(tiny_gpt2("smollm"));
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s(static_cast<size_t>(rng() % 24), '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    Ids ids;
    ASSERT_NO_THROW(ids = t.encode(s));
    EXPECT_EQ(ids, t.encode(ts::sanitize_utf8(s)));
    ASSERT_NO_THROW((void)t.decode(ids));
  }
}

// ---------------------------------------------------------------------------
// SmolLM2-135M-Instruct vs Hugging Face
// ---------------------------------------------------------------------------
namespace {

std::string hex_to_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("TOUCHSTONE_MODEL");
    if (path == nullptr || *path == '\0') {
      skip_reason_ = "TOUCHSTONE_MODEL is not set (path of SmolLM2-135M-Instruct.Q4_1.gguf)";
      return;
    }
    if (!std::filesystem::exists(path)) {
      skip_reason_ = std::string("TOUCHSTONE_MODEL=") + path + " does not exist";
      return;
    }
#if TOUCHSTONE_TOKENIZER_HAVE_GGUF
    const auto f = ts::gguf::File::open(path);
    tok_ = std::make_unique<ts::Tokenizer>(ts::tokenizer_data_from_gguf(f));
#else
    skip_reason_ = "built without touchstone_gguf (no tokenizer_data_from_gguf)";
#endif
  }
  static void TearDownTestSuite() { tok_.reset(); }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << skip_reason_;
  }
  static nlohmann::json hf_data() {
    std::ifstream in(TOUCHSTONE_TOKENIZER_TEST_DATA);
    if (!in) throw std::runtime_error("cannot open " TOUCHSTONE_TOKENIZER_TEST_DATA);
    return nlohmann::json::parse(in);
  }
  static inline std::unique_ptr<ts::Tokenizer> tok_;
  static inline std::string skip_reason_;
};

}  // namespace

TEST_F(SmolLM2, Metadata) {
  const ts::Tokenizer& t = *tok_;
  EXPECT_EQ(t.n_vocab(), 49152);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_EQ(t.unk(), 0);
  EXPECT_EQ(t.pad(), 2);
  EXPECT_EQ(t.data().model, "gpt2");
  EXPECT_EQ(t.data().pre, "smollm");
  EXPECT_EQ(t.data().merges.size(), 48900u);
  EXPECT_FALSE(t.data().add_bos);
  EXPECT_EQ(t.find_token("<|im_start|>"), 1);
  EXPECT_EQ(t.find_token("<|im_end|>"), 2);
  EXPECT_EQ(t.find_token("<|endoftext|>"), 0);
  EXPECT_TRUE(t.is_control(1));
  EXPECT_FALSE(t.is_control(100));
}

TEST_F(SmolLM2, MatchesHuggingFaceIds) {
  const auto j = hf_data();
  ASSERT_GE(j["entries"].size(), 40u);
  size_t n = 0;
  for (const auto& e : j["entries"]) {
    const std::string text = e["text"].get<std::string>();
    const Ids want = e["ids"].get<Ids>();
    const std::string input =
        e.contains("bytes_hex") ? hex_to_bytes(e["bytes_hex"].get<std::string>()) : text;
    EXPECT_EQ(tok_->encode(input), want) << "text: " << ::testing::PrintToString(input);
    const std::string expect_decoded =
        e["roundtrip"].get<bool>() ? text : e["hf_decoded"].get<std::string>();
    EXPECT_EQ(tok_->decode(want), expect_decoded) << "ids of: " << ::testing::PrintToString(text);
    ++n;
  }
  EXPECT_EQ(n, j["entries"].size());
}

TEST_F(SmolLM2, SplitSpecialTokensMatchesHuggingFace) {
  const auto j = hf_data();
  ASSERT_FALSE(j["split_special_tokens_entries"].empty());
  for (const auto& e : j["split_special_tokens_entries"]) {
    const std::string text = e["text"].get<std::string>();
    EXPECT_EQ(tok_->encode(text, true, false), e["ids"].get<Ids>()) << text;
    EXPECT_EQ(tok_->decode(tok_->encode(text, true, false)), text);
  }
}

TEST_F(SmolLM2, SpecialTokens) {
  const ts::Tokenizer& t = *tok_;
  EXPECT_EQ(t.encode("<|im_start|>"), (Ids{1}));
  EXPECT_EQ(t.encode("<|im_start|><|im_end|>"), (Ids{1, 2}));
  const Ids chat = t.encode("<|im_start|>user\nHi<|im_end|>\n");
  ASSERT_GE(chat.size(), 4u);
  EXPECT_EQ(chat.front(), 1);
  EXPECT_EQ(t.decode(chat), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(t.decode(chat, true), "user\nHi\n");
  // As text, "<|im_start|>" is several ordinary tokens, none of them control.
  const Ids plain = t.encode("<|im_start|>", true, false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_FALSE(t.is_control(id)) << id;
  EXPECT_EQ(t.decode(plain), "<|im_start|>");
  // add_bos=true adds nothing: add_bos_token is false for SmolLM2 (as HF).
  EXPECT_EQ(t.encode("Hello", true), t.encode("Hello", false));
  EXPECT_EQ(t.token_bytes(1), "<|im_start|>");
}

TEST_F(SmolLM2, InvalidIds) {
  try {
    (void)tok_->decode(Ids{1, 49152});
    FAIL() << "expected an error";
  } catch (const ts::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("49152"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)tok_->decode(Ids{-7}), ts::Error);
}

TEST_F(SmolLM2, RandomBytesRoundTripThroughSanitizer) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(static_cast<size_t>(rng() % 64), '\0');
    for (char& c : s)
      c = static_cast<char>(rng() % 3 == 0 ? (rng() & 0xFF) : (0x20 + rng() % 0x5F));
    Ids ids;
    ASSERT_NO_THROW(ids = tok_->encode(s));
    EXPECT_EQ(ids, tok_->encode(ts::sanitize_utf8(s)));
  }
}

TEST_F(SmolLM2, EncodesTwoThousandTokensFast) {
  const std::string para =
      "The quick brown fox jumps over the lazy dog; 12345 + 678 = 13023. "
      "def f(x):\n    return x * 2  # comment\n\tTabs\tand   spaces. Привет, 你好, مرحبا! "
      "👍🏽\n";
  std::string text;
  while (tok_->encode(text).size() < 2000) text += para;
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok_->encode(text);
  const auto ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ids.size(), 2000u);
  EXPECT_EQ(tok_->decode(ids), text);
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(ms, 1000.0);
#else
  EXPECT_LT(ms, 100.0) << ids.size() << " tokens took " << ms << " ms";
#endif
  RecordProperty("encode_ms", std::to_string(ms));
}
