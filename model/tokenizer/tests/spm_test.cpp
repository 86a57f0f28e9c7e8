// spm_test.cpp - SentencePiece-style ("llama") tokenizer on a tiny vocabulary
// with hand-derived ids (llama.cpp llm_tokenizer_spm semantics: merge the
// adjacent pair whose merged text is a token with the highest score, leftmost
// on ties; symbols that are no token fall back to <0xXX> byte tokens, or to
// unk when the byte has no token).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/tokenizer.h"

namespace ts = touchstone;
using Ids = std::vector<int32_t>;

namespace {

ts::TokenizerData tiny_spm(bool add_space_prefix = true) {
  ts::TokenizerData d;
  d.model = "llama";
  d.pre = "default";
  //          0        1      2       3         4         5         6
  d.tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "<0x21>", "<0xC3>", "<0xA9>",
              //  7         8    9    10   11   12    13    14        15     16          17
              "\u2581", "h", "e", "l", "o", "ll", "he", "\u2581h", "llo", "\u2581he",
              "\u2581hello"};
  d.token_types = {2, 3, 3, 6, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  d.scores = {0, 0, 0, 0, 0, 0, 0, -1, -2, -2, -2, -2, -3, -4, -5, -3.5f, -6, -7};
  d.unk = 0;
  d.bos = 1;
  d.eos = 2;
  d.add_bos = true;
  d.add_space_prefix = add_space_prefix;
  return d;
}

}  // namespace

TEST(TinySpm, MergesByScore) {
  ts::Tokenizer t(tiny_spm());
  // "▁hello": ll(-3) -> llo(-3.5) -> he(-4) -> ▁he(-6) -> ▁hello(-7);
  // the early ▁h(-5) bigram goes stale once h is merged into "he".
  EXPECT_EQ(t.encode("hello", false), (Ids{17}));
  // "▁hell": ll, he, ▁he -> [▁he, ll]
  EXPECT_EQ(t.encode("hell", false), (Ids{16, 12}));
  // "▁he▁llo": ll, llo, he, ▁he -> [▁he, ▁, llo]
  EXPECT_EQ(t.encode("he llo", false), (Ids{16, 7, 15}));
}

TEST(TinySpm, EqualScoresMergeLeftmostFirst) {
  ts::Tokenizer t(tiny_spm());
  EXPECT_EQ(t.encode("lll", false), (Ids{7, 12, 10}));  // ▁ ll l, not ▁ l ll
}

TEST(TinySpm, ByteFallback) {
  ts::Tokenizer t(tiny_spm());
  // "▁hé!": ▁h merges; é (C3 A9) and ! are no tokens -> <0xC3> <0xA9> <0x21>
  EXPECT_EQ(t.encode("hé!", false), (Ids{14, 5, 6, 4}));
  EXPECT_EQ(t.encode("\n", false), (Ids{7, 3}));
  // 'z' has neither a token nor a <0x7A> byte token -> unk
  EXPECT_EQ(t.encode("z", false), (Ids{7, 0}));
  EXPECT_EQ(t.decode(Ids{14, 5, 6, 4}), "hé!");
  EXPECT_EQ(t.token_bytes(5), "\xC3");
  EXPECT_EQ(t.token_bytes(3), "\n");
}

TEST(TinySpm, SpacePrefixAndBos) {
  ts::Tokenizer t(tiny_spm());
  EXPECT_EQ(t.encode("hello"), (Ids{1, 17}));  // add_bos in the data
  EXPECT_EQ(t.encode("hello", false), (Ids{17}));
  EXPECT_EQ(t.encode(""), (Ids{1}));
  EXPECT_EQ(t.encode("", false), (Ids{}));
  // A space is prefixed again after a special token (llama.cpp is_prev_special).
  EXPECT_EQ(t.encode("hello<s>hello", false), (Ids{17, 1, 17}));
  EXPECT_EQ(t.encode("<unk>", false), (Ids{0}));
  // parse_special=false: "<s>" is text: ▁ then '<' 's' '>' without tokens -> unk
  EXPECT_EQ(t.encode("<s>", false, false), (Ids{7, 0, 0, 0}));

  ts::Tokenizer np(tiny_spm(false));
  EXPECT_EQ(np.encode("hello", false), (Ids{13, 15}));  // he + llo, no ▁
  EXPECT_EQ(np.decode(Ids{13, 15}), "hello");
}

TEST(TinySpm, Decode) {
  ts::Tokenizer t(tiny_spm());
  EXPECT_EQ(t.decode(Ids{17}), "hello");  // prefix space removed
  EXPECT_EQ(t.decode(Ids{16, 7, 15}), "he llo");
  EXPECT_EQ(t.decode(Ids{1, 17}, true), "hello");
  EXPECT_EQ(t.decode(Ids{1, 17}), "<s> hello");
  EXPECT_EQ(t.decode(Ids{0, 17}, true), "hello");  // <unk> is special
  EXPECT_EQ(t.token_bytes(17), " hello");
  EXPECT_TRUE(t.is_control(1));
  EXPECT_EQ(t.token_type(5), ts::TokenType::Byte);
  // Round trip (every character here has a token or a byte token).
  for (const char* s : {"hello", "he llo", "hé!", "\n\nhe"}) {
    EXPECT_EQ(t.decode(t.encode(s), /*skip_special=*/true), s) << s;
    EXPECT_EQ(t.decode(t.encode(s, false)), s) << s;
  }
  EXPECT_THROW((void)t.decode(Ids{18}), ts::Error);
}

TEST(TinySpm, TypesInferredWhenMissing) {
  auto d = tiny_spm();
  d.token_types.clear();  // <0xXX> become byte tokens, everything else normal
  ts::Tokenizer t(d);
  EXPECT_EQ(t.encode("hé!", false), (Ids{14, 5, 6, 4}));
  EXPECT_EQ(t.token_type(5), ts::TokenType::Byte);
}

TEST(TinySpm, InvalidUtf8) {
  ts::Tokenizer t(tiny_spm());
  // "\xFF" -> U+FFFD (EF BF BD): no token, no byte tokens -> 3x unk
  EXPECT_EQ(t.encode("h\xFF", false), (Ids{14, 0, 0, 0}));
}

TEST(TinySpm, RejectsBadData) {
  auto d = tiny_spm();
  d.scores.pop_back();
  EXPECT_THROW(ts::Tokenizer{d}, ts::Error);
  d = tiny_spm();
  d.token_types[7] = 6;  // "▁" marked as byte token
  EXPECT_THROW(ts::Tokenizer{d}, ts::Error);
  d = tiny_spm();
  d.token_types[7] = 9;
  EXPECT_THROW(ts::Tokenizer{d}, ts::Error);
}
