// oracle_test.cpp - the grammar mask oracle on the real vocabularies of SmolLM2
// (byte-level BPE) and Gemma 3 270M (SentencePiece with byte fallback), from the
// paths CMake compiles in (TOUCHSTONE_MODEL_PATH and the Gemma 3 file beside it;
// env TOUCHSTONE_MODEL / TOUCHSTONE_GEMMA_MODEL override them). A model that is
// absent skips its cases, naming the path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <sstream>

#include "touchstone/grammar/oracle.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"

namespace ts = touchstone;
namespace tg = touchstone::grammar;

namespace {

// ---- without a model ------------------------------------------------------------

TEST(GrammarKind, NamesRoundTripAndUnknownIsAnError) {
  for (auto k : {tg::GrammarKind::json_schema, tg::GrammarKind::gbnf, tg::GrammarKind::regex}) {
    EXPECT_EQ(tg::parse_grammar_kind(tg::grammar_kind_name(k)), k);
  }
  EXPECT_EQ(tg::grammar_kind_name(tg::GrammarKind::json_schema), "json_schema");
  try {
    tg::parse_grammar_kind("lark");
    FAIL() << "no GrammarError";
  } catch (const tg::GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("\"lark\""), std::string::npos) << e.what();
  }
}

TEST(GrammarMask, HelpersAndDigest) {
  const std::vector<uint32_t> mask{0x80000001u, 0x00000004u};
  EXPECT_TRUE(tg::mask_allows(mask, 0));
  EXPECT_FALSE(tg::mask_allows(mask, 1));
  EXPECT_TRUE(tg::mask_allows(mask, 31));
  EXPECT_TRUE(tg::mask_allows(mask, 34));
  EXPECT_FALSE(tg::mask_allows(mask, 64));
  EXPECT_FALSE(tg::mask_allows(mask, -1));
  EXPECT_EQ(tg::mask_count(mask), 3u);
  // FNV-1a 64 of no bytes, and of the bytes 01 00 00 00 (computed by hand).
  EXPECT_EQ(tg::mask_digest({}), 0xcbf29ce484222325ull);
  const std::vector<uint32_t> one{1u};
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t b : {1u, 0u, 0u, 0u}) h = (h ^ b) * 0x100000001b3ull;
  EXPECT_EQ(tg::mask_digest(one), h);
  EXPECT_NE(tg::mask_digest(one), tg::mask_digest(std::vector<uint32_t>{1u << 8}));
}

// ---- the two real vocabularies --------------------------------------------------

struct Model {
  std::unique_ptr<ts::Tokenizer> tok;
  std::unique_ptr<tg::GrammarVocab> vocab;
  std::string skip;  // non-empty: why the model's cases are skipped
};

const Model& model(const std::string& which) {
  static std::map<std::string, Model> cache;
  auto [it, fresh] = cache.try_emplace(which);
  if (!fresh) return it->second;
  const bool smol = which == "smollm2";
  const char* env = std::getenv(smol ? "TOUCHSTONE_MODEL" : "TOUCHSTONE_GEMMA_MODEL");
  const std::string path = env != nullptr && *env != '\0'
                               ? env
                               : (smol ? TOUCHSTONE_GRAMMAR_SMOLLM2 : TOUCHSTONE_GRAMMAR_GEMMA);
  Model& m = it->second;
  if (!std::filesystem::exists(path)) {
    m.skip = "model not found: " + path + " (python3 ci/fetch_models.py goldens/manifest.json)";
  } else {
    m.tok =
        std::make_unique<ts::Tokenizer>(ts::tokenizer_data_from_gguf(ts::gguf::File::open(path)));
    m.vocab = std::make_unique<tg::GrammarVocab>(*m.tok);
  }
  return m;
}

std::string read_data(const std::string& name) {
  std::ifstream in(std::string(TOUCHSTONE_GRAMMAR_TEST_DATA) + "/" + name, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open test data " + name);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A nested object, an enum and numbers.
const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "role": {"enum": ["admin", "user", "guest"]},
    "score": {"type": "number"},
    "address": {
      "type": "object",
      "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
      "required": ["city", "zip"]
    }
  },
  "required": ["name", "role", "score", "address"]
})";
const char* kConforming = R"({"name": "Ada Lovelace", "role": "admin", "score": -12.5e3, )"
                          R"("address": {"city": "Zürich", "zip": 8001}})";

class Oracle : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const Model& m = model(GetParam());
    if (!m.skip.empty()) GTEST_SKIP() << m.skip;
    tok_ = m.tok.get();
    vocab_ = m.vocab.get();
  }
  std::vector<int32_t> encode(const std::string& text) const {
    return tok_->encode(text, /*add_bos=*/false, /*parse_special=*/false);
  }
  tg::GrammarOracle oracle(tg::GrammarKind kind, std::string text, std::string name) const {
    return tg::GrammarOracle(*vocab_, tg::GrammarSpec{kind, std::move(text), std::move(name)});
  }
  // Every token of `text` (our tokenizer's ids) is allowed, then accepted.
  void walk(tg::GrammarOracle& o, const std::string& text) const {
    const std::vector<int32_t> ids = encode(text);
    ASSERT_EQ(tok_->decode(ids), text);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(tg::mask_allows(o.allowed_mask(), ids[i]))
          << "token " << i << " id " << ids[i] << " '" << tok_->token_bytes(ids[i]) << "'";
      ASSERT_TRUE(o.accept(ids[i])) << "token " << i << " id " << ids[i];
    }
  }
  // The id of a token whose bytes are exactly `bytes` (the first such id).
  int32_t token_with_bytes(const std::string& bytes) const {
    for (int32_t id = 0; id < tok_->n_vocab(); ++id) {
      if (vocab_->is_text(id) && tok_->token_bytes(id) == bytes) return id;
    }
    return -1;
  }
  const ts::Tokenizer* tok_ = nullptr;
  const tg::GrammarVocab* vocab_ = nullptr;
};

TEST_P(Oracle, VocabularyStopAndControlTokens) {
  EXPECT_EQ(vocab_->n_vocab(), tok_->n_vocab());
  EXPECT_EQ(vocab_->mask_words(), (size_t(tok_->n_vocab()) + 31) / 32);
  EXPECT_TRUE(vocab_->is_stop(tok_->eos()));
  EXPECT_FALSE(vocab_->is_text(tok_->eos()));
  const auto eot = tok_->find_token("<end_of_turn>");
  EXPECT_EQ(eot.has_value(), GetParam() == "gemma3");
  if (eot) {
    EXPECT_TRUE(vocab_->is_stop(*eot));
  }
  EXPECT_EQ(vocab_->stop_tokens().size(), eot ? 2u : 1u);
  for (int32_t id = 0; id < tok_->n_vocab(); ++id) {
    if (tok_->is_control(id)) {
      ASSERT_FALSE(vocab_->is_text(id)) << id;
    }
  }
  EXPECT_GT(vocab_->n_text_tokens(), size_t(tok_->n_vocab()) * 9 / 10);
}

TEST_P(Oracle, JsonSchemaConformingStringWalksAndTerminates) {
  auto o = oracle(tg::GrammarKind::json_schema, kSchema, "nested_enum_number");
  EXPECT_FALSE(o.can_terminate());
  EXPECT_FALSE(tg::mask_allows(o.allowed_mask(), tok_->eos()));
  walk(o, kConforming);
  ASSERT_TRUE(o.can_terminate());
  for (int32_t s : vocab_->stop_tokens()) EXPECT_TRUE(tg::mask_allows(o.allowed_mask(), s));
  EXPECT_TRUE(o.accept(tok_->eos()));
  EXPECT_TRUE(o.is_terminated());
  EXPECT_EQ(tg::mask_count(o.allowed_mask()), 0u);
  EXPECT_FALSE(o.accept(encode(" ")[0]));
}

TEST_P(Oracle, JsonSchemaRejectsTokensThatBreakIt) {
  auto o = oracle(tg::GrammarKind::json_schema, kSchema, "nested_enum_number");
  const uint64_t start = o.mask_digest();
  const int32_t bracket = encode("[")[0];
  EXPECT_FALSE(tg::mask_allows(o.allowed_mask(), bracket));
  EXPECT_FALSE(o.accept(bracket));
  EXPECT_FALSE(o.accept(tok_->eos()));  // the empty string is no sentence
  EXPECT_EQ(o.mask_digest(), start);    // rejected: the state is unchanged
  EXPECT_EQ(o.n_accepted(), 0);
  // After `"role": ` only the enum's strings: no `"x`, no digit.
  walk(o, R"({"name": "A", "role": )");
  const std::vector<uint32_t> m = o.allowed_mask();
  EXPECT_TRUE(tg::mask_allows(m, encode("\"")[0]));
  for (const char* bad : {"7", "[", "{", "t"}) {
    const int32_t id = encode(bad)[0];
    EXPECT_FALSE(tg::mask_allows(m, id)) << bad;
    EXPECT_FALSE(o.accept(id)) << bad;
  }
  walk(o, R"("gu)");
  EXPECT_FALSE(o.accept(encode("a")[0]));  // "gua..." is no role
  walk(o, R"(est", "score": )");
  EXPECT_FALSE(o.accept(encode("\"")[0]));  // a number, not a string
}

// llama.cpp's stock json.gbnf: its last rule starts with an empty alternative
// (`ws ::= | " " | ...`), which GBNF allows and XGrammar's EBNF parser alone
// does not ("Expect element, but got |"); gbnf_to_xgrammar spells it `""`, so
// the stock file compiles and walks on both vocabularies.
TEST_P(Oracle, LlamaCppJsonGbnfCompilesThroughTheDialectConversion) {
  const std::string stock = read_data("json.gbnf");
  auto o = oracle(tg::GrammarKind::gbnf, stock, "llama.cpp json.gbnf");
  EXPECT_FALSE(tg::mask_allows(o.allowed_mask(), encode("[")[0]));  // root ::= object
  walk(o, R"({"a": [1, 2.5, "x\n\u00e9 ü", true, null], "b": {}})");
  EXPECT_TRUE(o.can_terminate());
  EXPECT_FALSE(o.is_completed());  // trailing ws may follow
}

TEST(GbnfDialect, EmptyAlternativesBecomeTheEmptyString) {
  EXPECT_EQ(tg::gbnf_to_xgrammar(R"(ws ::= | " " | "\n")"), R"(ws ::= "" | " " | "\n")");
  EXPECT_EQ(tg::gbnf_to_xgrammar(R"(a ::= ( | "x" ) "y")"), R"(a ::= ( "" | "x" ) "y")");
  // Literals, classes and comments are left alone, even when they hold | or (.
  const std::string kept = "a ::= \"(|\" [|(] # ( | )\nb ::= \"b\"";
  EXPECT_EQ(tg::gbnf_to_xgrammar(kept), kept);
}

TEST_P(Oracle, RegexDateWalksAndCompletes) {
  auto o = oracle(tg::GrammarKind::regex, R"(\d{4}-\d{2}-\d{2})", "iso_date");
  EXPECT_FALSE(tg::mask_allows(o.allowed_mask(), encode("a")[0]));
  EXPECT_FALSE(tg::mask_allows(o.allowed_mask(), encode("-")[0]));
  walk(o, "2024-06-01");
  EXPECT_TRUE(o.can_terminate());
  EXPECT_TRUE(o.is_completed());  // nothing but a stop token may follow
  EXPECT_EQ(tg::mask_count(o.allowed_mask()), vocab_->stop_tokens().size());
}

// Inside a JSON string any character may come, yet no control token (BOS, chat
// markers) is allowed, and accepting one is refused.
TEST_P(Oracle, ControlTokensAreNeverAllowed) {
  auto o = oracle(tg::GrammarKind::json_schema, kSchema, "nested_enum_number");
  walk(o, R"({"name": ")");
  const std::vector<uint32_t> m = o.allowed_mask();
  EXPECT_GT(tg::mask_count(m), vocab_->n_text_tokens() / 2);
  for (int32_t id = 0; id < tok_->n_vocab(); ++id) {
    if (tok_->is_control(id)) {
      ASSERT_FALSE(tg::mask_allows(m, id)) << id << " " << tok_->token_bytes(id);
    }
  }
  const auto im_start =
      tok_->find_token(GetParam() == "smollm2" ? "<|im_start|>" : "<start_of_turn>");
  ASSERT_TRUE(im_start.has_value());
  EXPECT_FALSE(o.accept(*im_start));
  if (tok_->bos() >= 0) {
    EXPECT_FALSE(o.accept(tok_->bos()));
  }
}

// root ::= "é" (UTF-8 C3 A9): the allowed set is exactly the text tokens whose
// bytes are a non-empty prefix of what remains: the whole character's token(s)
// and the lone byte C3 (SmolLM2: the byte-level token "Ã"; Gemma 3: the byte
// fallback token <0xC3>), then the lone byte A9.
TEST_P(Oracle, MultiByteCharacterWholeOrByteByByte) {
  const std::string e_acute = "\xC3\xA9";
  auto expected = [&](const std::string& rest) {
    std::vector<uint32_t> m(vocab_->mask_words(), 0u);
    for (int32_t id = 0; id < tok_->n_vocab(); ++id) {
      if (!vocab_->is_text(id)) continue;
      const std::string b = tok_->token_bytes(id);
      if (!b.empty() && rest.compare(0, b.size(), b) == 0) m[size_t(id) / 32] |= 1u << (id % 32);
    }
    return m;
  };
  auto o = oracle(tg::GrammarKind::gbnf, "root ::= \"" + e_acute + "\"", "e_acute");
  EXPECT_EQ(o.allowed_mask(), expected(e_acute));
  EXPECT_FALSE(tg::mask_allows(o.allowed_mask(), encode("e")[0]));
  const int32_t c3 = token_with_bytes("\xC3"), a9 = token_with_bytes("\xA9");
  ASSERT_GE(c3, 0);
  ASSERT_GE(a9, 0);
  if (GetParam() == "gemma3") {
    EXPECT_EQ(tok_->token_type(c3), ts::TokenType::Byte);
    EXPECT_EQ(tok_->find_token("<0xC3>"), c3);
    EXPECT_EQ(tok_->find_token("<0xA9>"), a9);
  }
  auto whole = o.fork();
  walk(whole, e_acute);  // our tokenizer's ids for "é"
  EXPECT_TRUE(whole.is_completed());
  EXPECT_FALSE(o.accept(a9));
  ASSERT_TRUE(o.accept(c3));
  EXPECT_FALSE(o.can_terminate());
  EXPECT_EQ(o.allowed_mask(), expected("\xA9"));
  ASSERT_TRUE(o.accept(a9));
  EXPECT_TRUE(o.is_completed());
  EXPECT_TRUE(tg::mask_allows(o.allowed_mask(), tok_->eos()));
}

TEST_P(Oracle, BadGrammarsThrowGrammarErrorNamingTheCase) {
  struct Bad {
    tg::GrammarKind kind;
    const char* text;
    const char* name;
    const char* says;  // part of XGrammar's message
  };
  const Bad bad[] = {
      {tg::GrammarKind::gbnf, "root ::= \"a\" b\nb ::= (\"x\" | \"y\"\n", "unclosed_paren",
       "line 3"},
      {tg::GrammarKind::gbnf, "root ::= item", "undefined_rule", "\"item\" is not defined"},
      {tg::GrammarKind::json_schema, R"({"type": "object", "properties": )", "truncated_schema",
       "JSON"},
      {tg::GrammarKind::json_schema, R"({"type": "frobnicate"})", "unknown_type", "frobnicate"},
      {tg::GrammarKind::regex, "(ab", "unbalanced_regex", "egex"},
  };
  for (const Bad& b : bad) {
    try {
      oracle(b.kind, b.text, b.name);
      ADD_FAILURE() << b.name << " compiled";
    } catch (const tg::GrammarError& e) {
      const std::string what = e.what();
      const std::string head = std::string("grammar \"") + b.name + "\" (" +
                               std::string(tg::grammar_kind_name(b.kind)) + "): ";
      EXPECT_EQ(what.rfind(head, 0), 0u) << what;
      EXPECT_NE(what.find(b.says), std::string::npos) << what;
      EXPECT_EQ(what.find(".cc:"), std::string::npos) << what;  // no XGrammar source location
    }
  }
}

// An empty language is an error: XGrammar's own checks (minimum > maximum), and
// the oracle's (no token may start the output and the empty string is no
// sentence). The latter is per vocabulary: SmolLM2 has no token for the byte
// 0x04, Gemma 3 has the byte-fallback token <0x04>.
TEST_P(Oracle, EmptyLanguageIsAnError) {
  auto fails = [&](tg::GrammarKind kind, const std::string& text, const std::string& name,
                   const std::string& says) {
    try {
      oracle(kind, text, name);
      ADD_FAILURE() << name << " compiled";
    } catch (const tg::GrammarError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("grammar \"" + name + "\" (", 0), 0u) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
    }
  };
  const std::string empty = "the language is empty";
  fails(tg::GrammarKind::json_schema, R"({"type": "integer", "minimum": 5, "maximum": 3})",
        "min_above_max", "minimum greater than maximum");
  fails(tg::GrammarKind::gbnf, R"(root ::= [^\x00-\U0010FFFF])", "no_character", empty);
  fails(tg::GrammarKind::regex, R"([^\s\S])", "no_character", empty);
  if (GetParam() == "smollm2") {
    fails(tg::GrammarKind::gbnf, R"(root ::= "\x04")", "byte_04", empty);
  } else {
    auto o = oracle(tg::GrammarKind::gbnf, R"(root ::= "\x04")", "byte_04");
    EXPECT_EQ(o.allowed_mask(), [&] {
      std::vector<uint32_t> m(vocab_->mask_words(), 0u);
      const int32_t b = *tok_->find_token("<0x04>");
      m[size_t(b) / 32] = 1u << (b % 32);
      return m;
    }());
  }
  // The empty string alone is a language: only stop tokens are allowed.
  auto e = oracle(tg::GrammarKind::gbnf, R"(root ::= "")", "empty_string");
  EXPECT_TRUE(e.is_completed());
}

TEST_P(Oracle, RollbackRestoresTheMaskAndForkIsIndependent) {
  auto o = oracle(tg::GrammarKind::json_schema, kSchema, "nested_enum_number");
  const std::vector<int32_t> ids = encode(kConforming);
  std::vector<uint64_t> d{o.mask_digest()};
  for (int32_t id : ids) {
    ASSERT_TRUE(o.accept(id));
    d.push_back(o.mask_digest());
  }
  EXPECT_NE(d[0], d[1]);
  ASSERT_TRUE(o.accept(tok_->eos()));
  o.rollback(1);  // un-terminates
  EXPECT_FALSE(o.is_terminated());
  EXPECT_TRUE(o.can_terminate());
  EXPECT_EQ(o.mask_digest(), d.back());
  o.rollback(5);
  EXPECT_EQ(o.n_accepted(), int(ids.size()) - 5);
  EXPECT_EQ(o.mask_digest(), d[ids.size() - 5]);
  EXPECT_FALSE(o.can_terminate());
  auto f = o.fork();
  for (size_t i = ids.size() - 5; i < ids.size(); ++i) ASSERT_TRUE(f.accept(ids[i]));
  EXPECT_TRUE(f.can_terminate());
  EXPECT_EQ(o.mask_digest(), d[ids.size() - 5]);  // the fork moved, o did not
  o.rollback(o.n_accepted());
  EXPECT_EQ(o.mask_digest(), d[0]);
  EXPECT_THROW(o.rollback(1), std::out_of_range);
  EXPECT_THROW(o.rollback(-1), std::out_of_range);
}

TEST_P(Oracle, ApplyMaskSetsExactlyTheDisallowedToMinusInfinity) {
  auto o = oracle(tg::GrammarKind::regex, R"(\d{4}-\d{2}-\d{2})", "iso_date");
  std::vector<float> logits(size_t(tok_->n_vocab()), 0.5f);
  const std::vector<uint32_t> m = o.allowed_mask();
  EXPECT_EQ(o.apply_mask(logits), tg::mask_count(m));
  for (int32_t id = 0; id < tok_->n_vocab(); ++id) {
    ASSERT_EQ(std::isfinite(logits[size_t(id)]), tg::mask_allows(m, id)) << id;
  }
  logits.pop_back();
  EXPECT_THROW(o.apply_mask(logits), std::invalid_argument);
  std::vector<uint32_t> short_mask(3);
  EXPECT_THROW(o.fill_mask(short_mask), std::invalid_argument);
}

// A stand-in model: fixed pseudo-random logits (seeded by the call number) with
// every stop token boosted to +100, so a stop token wins whenever the mask lets it.
tg::NextLogits fake_model(const tg::GrammarVocab& v, std::vector<int32_t>& fed) {
  return [&v, &fed](int32_t token_fed) {
    std::mt19937 rng(uint32_t(fed.size()));
    fed.push_back(token_fed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> l(size_t(v.n_vocab()));
    for (float& x : l) x = u(rng);
    for (int32_t s : v.stop_tokens()) l[size_t(s)] = 100.f;
    return l;
  };
}

TEST_P(Oracle, ConstrainedGreedyFollowsTheGrammarAndStops) {
  std::vector<int32_t> fed;
  auto date = oracle(tg::GrammarKind::regex, R"(\d{4}-\d{2}-\d{2})", "iso_date");
  const tg::ConstrainedResult r = tg::constrained_greedy(date, fake_model(*vocab_, fed), 64);
  EXPECT_EQ(r.stop, tg::ConstrainedResult::Stop::completed);
  EXPECT_TRUE(std::regex_match(tok_->decode(r.tokens), std::regex(R"(\d{4}-\d{2}-\d{2})")))
      << tok_->decode(r.tokens);
  ASSERT_EQ(fed.size(), r.tokens.size());  // not asked again once completed
  EXPECT_EQ(fed[0], -1);
  for (size_t i = 1; i < fed.size(); ++i) EXPECT_EQ(fed[i], r.tokens[i - 1]);

  // An integer may end after its first digit: the boosted stop token comes then.
  fed.clear();
  auto integer = oracle(tg::GrammarKind::json_schema, R"({"type": "integer"})", "integer");
  const tg::ConstrainedResult n = tg::constrained_greedy(integer, fake_model(*vocab_, fed), 64);
  ASSERT_EQ(n.stop, tg::ConstrainedResult::Stop::stop_token);
  ASSERT_GE(n.tokens.size(), 2u);
  EXPECT_TRUE(vocab_->is_stop(n.tokens.back()));
  const std::vector<int32_t> body(n.tokens.begin(), n.tokens.end() - 1);
  EXPECT_TRUE(std::regex_match(tok_->decode(body), std::regex(R"(-?(0|[1-9][0-9]*))")))
      << tok_->decode(body);
  EXPECT_TRUE(integer.is_terminated());

  fed.clear();
  auto cut = oracle(tg::GrammarKind::regex, R"(\d{4}-\d{2}-\d{2})", "iso_date");
  const tg::ConstrainedResult c = tg::constrained_greedy(cut, fake_model(*vocab_, fed), 2);
  EXPECT_EQ(c.stop, tg::ConstrainedResult::Stop::max_tokens);
  EXPECT_EQ(c.tokens.size(), 2u);
  auto wrong = oracle(tg::GrammarKind::regex, "a", "a");
  EXPECT_THROW(tg::constrained_greedy(
                   wrong, [](int32_t) { return std::vector<float>(3); }, 4),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Models, Oracle, ::testing::Values("smollm2", "gemma3"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
