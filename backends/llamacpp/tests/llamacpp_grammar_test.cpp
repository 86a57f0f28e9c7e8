// llamacpp_grammar_test.cpp - the llama.cpp backend's ABI v7 structured output
// (compile_grammar on llama.cpp's grammar sampler, src/llamacpp_grammar.h)
// through its ts_backend table on SmolLM2 (TOUCHSTONE_MODEL, else the path CMake
// compiles in). The expected allowed sets come from our tokenizer's token bytes
// (touchstone/model/tokenizer.h), not from llama.cpp; the stop tokens are
// llama.cpp's end-of-generation set (llama_vocab_is_eog), as the contract says.
// A model that is absent skips its cases, naming the path.
#include <gtest/gtest.h>
#include <llama.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend_table.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"

namespace {

using Mask = std::vector<uint32_t>;
using Tokens = std::vector<int32_t>;

using touchstone::llamacpp::test::backend_table;

std::string smollm2_path() {
  const char* env = std::getenv("TOUCHSTONE_MODEL");
  return env && *env ? env : TOUCHSTONE_LLAMACPP_TEST_MODEL;
}

// SmolLM2 through the backend's table, our tokenizer of it, and llama.cpp's
// vocabulary (for llama_vocab_is_eog only).
struct Smol {
  const ts_backend* t = nullptr;
  ts_model* model = nullptr;
  int32_t n_vocab = 0;
  std::unique_ptr<touchstone::Tokenizer> tok;
  std::vector<std::string> bytes;  // token_bytes of every id
  std::vector<int32_t> stops;      // llama_vocab_is_eog
  std::string skip;

  Smol() {
    const std::string path = smollm2_path();
    if (!std::filesystem::exists(path)) {
      skip = "model not found: " + path + " (python3 ci/fetch_models.py goldens/manifest.json)";
      return;
    }
    t = backend_table();
    if (t->load_model(path.c_str(), &model) != TS_OK)
      throw std::runtime_error(std::string("load_model: ") + t->last_error());
    n_vocab = t->n_vocab(model);
    tok = std::make_unique<touchstone::Tokenizer>(
        touchstone::tokenizer_data_from_gguf(touchstone::gguf::File::open(path)));
    for (int32_t i = 0; i < n_vocab; ++i) bytes.push_back(tok->token_bytes(i));
    llama_model_params p = llama_model_default_params();
    p.vocab_only = true;
    llama_model* vm = llama_model_load_from_file(path.c_str(), p);
    if (!vm) throw std::runtime_error("llama.cpp cannot load the vocabulary of " + path);
    for (int32_t i = 0; i < n_vocab; ++i)
      if (llama_vocab_is_eog(llama_model_get_vocab(vm), i)) stops.push_back(i);
    llama_model_free(vm);
  }
  bool is_stop(int32_t id) const {
    return std::find(stops.begin(), stops.end(), id) != stops.end();
  }
  // The id of the token whose bytes are exactly `s` (the lowest such id).
  int32_t id_of(const std::string& s) const {
    for (int32_t i = 0; i < n_vocab; ++i)
      if (bytes[size_t(i)] == s) return i;
    throw std::runtime_error("no token with the bytes '" + s + "'");
  }
};

const Smol& smol() {
  static Smol s;
  return s;
}

bool allowed(const Mask& m, int32_t id) { return (m[size_t(id) / 32] >> (id % 32)) & 1u; }

// The allowed set of a grammar whose viable prefixes and sentences are given
// as predicates on the text so far: a token is allowed iff it has bytes and the
// text with them is still viable; a stop token iff the text is a sentence.
template <class Viable, class Complete>
Mask expected_mask(const Smol& m, const std::string& text, Viable&& viable, Complete&& complete) {
  Mask out(size_t(TS_MASK_WORDS(m.n_vocab)), 0u);
  for (int32_t i = 0; i < m.n_vocab; ++i) {
    const bool ok = m.is_stop(i) ? complete(text)
                                 : !m.bytes[size_t(i)].empty() && viable(text + m.bytes[size_t(i)]);
    if (ok) out[size_t(i) / 32] |= 1u << (i % 32);
  }
  return out;
}

// root ::= "yes" | "no"
const char* kYesNo = R"(root ::= "yes" | "no")";
bool yes_no_viable(const std::string& s) {
  return std::string("yes").starts_with(s) || std::string("no").starts_with(s);
}
bool yes_no_complete(const std::string& s) { return s == "yes" || s == "no"; }

// A JSON-ish object: {"a":<digits>}
const char* kObject = R"(root ::= "{\"a\":" [0-9]+ "}")";
bool object_viable(const std::string& s) {
  const std::string head = "{\"a\":";
  if (s.size() <= head.size()) return head.starts_with(s);
  if (!s.starts_with(head)) return false;
  size_t d = head.size();
  while (d < s.size() && s[d] >= '0' && s[d] <= '9') ++d;
  return d == s.size() || (d > head.size() && s.substr(d) == "}");
}
bool object_complete(const std::string& s) {
  return object_viable(s) && s.size() >= 7 && s.back() == '}';
}

std::string describe_diff(const Smol& m, const Mask& got, const Mask& want) {
  std::string out;
  int shown = 0;
  for (int32_t i = 0; i < m.n_vocab && shown < 12; ++i) {
    if (allowed(got, i) == allowed(want, i)) continue;
    out += (allowed(got, i) ? " +" : " -") + std::to_string(i) + "'" + m.bytes[size_t(i)] + "'";
    ++shown;
  }
  return out.empty() ? "(equal)" : out;
}

// One session of SmolLM2 with a prompt prefilled.
class LlamaCppGrammar : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!smol().skip.empty()) GTEST_SKIP() << smol().skip;
    m = &smol();
    t = m->t;
    s = open();
    logits.resize(size_t(m->n_vocab));
    const Tokens prompt = m->tok->encode("Is the sky blue? Answer:", false);
    ASSERT_EQ(t->prefill(s, prompt.data(), int32_t(prompt.size()), 0, logits.data()), TS_OK)
        << t->last_error();
    start = t->position(s);
  }
  void TearDown() override {
    for (ts_session* f : forks) t->free_session(f);
    if (s) t->free_session(s);
  }
  ts_session* open() {
    ts_session_options o{};
    o.struct_size = sizeof o;
    o.weight_path = TS_WEIGHTS_QUANTIZED;
    o.n_threads = 2;
    o.max_context = 128;
    ts_session* out = nullptr;
    EXPECT_EQ(t->open_session(m->model, &o, &out), TS_OK) << t->last_error();
    return out;
  }
  ts_status set(ts_session* on, const char* text, ts_grammar_kind kind = TS_GRAMMAR_GBNF) {
    ts_grammar g{};
    g.struct_size = sizeof g;
    g.kind = kind;
    g.text = text;
    return t->set_grammar(on, &g);
  }
  Mask mask_of(ts_session* on) {
    Mask out(size_t(TS_MASK_WORDS(m->n_vocab)), 0xdeadbeefu);
    EXPECT_EQ(t->grammar_mask(on, out.data(), int32_t(out.size())), TS_OK) << t->last_error();
    return out;
  }
  ts_status feed(ts_session* on, const Tokens& ids) {
    return t->prefill(on, ids.data(), int32_t(ids.size()), 0, logits.data());
  }
  void expect_yes_no(ts_session* on, const std::string& text) {
    const Mask want = expected_mask(*m, text, yes_no_viable, yes_no_complete);
    const Mask got = mask_of(on);
    EXPECT_EQ(got, want) << "after '" << text << "':" << describe_diff(*m, got, want);
  }

  const Smol* m = nullptr;
  const ts_backend* t = nullptr;
  ts_session* s = nullptr;
  std::vector<ts_session*> forks;
  std::vector<float> logits;
  int32_t start = 0;
};

TEST_F(LlamaCppGrammar, DeclaresStructuredOutput) {
  ts_capabilities c{};
  c.struct_size = sizeof c;
  ASSERT_EQ(t->capabilities(&c), TS_OK);
  EXPECT_TRUE(c.flags & TS_CAP_STRUCTURED_OUTPUT);
  EXPECT_NE(t->set_grammar, nullptr);
  EXPECT_FALSE(m->stops.empty());
  EXPECT_TRUE(m->is_stop(m->tok->eos())) << "EOS " << m->tok->eos() << " is not end-of-generation";
}

TEST_F(LlamaCppGrammar, MaskIsExactlyWhatYesNoAllows) {
  ASSERT_EQ(set(s, kYesNo), TS_OK) << t->last_error();
  expect_yes_no(s, "");
  const Mask first = mask_of(s);
  for (const char* piece : {"y", "ye", "yes", "n", "no"})
    EXPECT_TRUE(allowed(first, m->id_of(piece))) << piece;
  EXPECT_FALSE(allowed(first, m->id_of("x")));
  ASSERT_EQ(feed(s, {m->id_of("n")}), TS_OK) << t->last_error();
  expect_yes_no(s, "n");
  ASSERT_EQ(feed(s, {m->id_of("o")}), TS_OK) << t->last_error();
  expect_yes_no(s, "no");  // only the stop tokens
  EXPECT_EQ(t->position(s), start + 2);
}

TEST_F(LlamaCppGrammar, MaskIsExactlyWhatTheObjectGrammarAllows) {
  ASSERT_EQ(set(s, kObject), TS_OK) << t->last_error();
  std::string text;
  const auto check = [&] {
    const Mask want = expected_mask(*m, text, object_viable, object_complete);
    const Mask got = mask_of(s);
    EXPECT_EQ(got, want) << "after '" << text << "':" << describe_diff(*m, got, want);
  };
  check();
  for (const std::string piece : {"{\"", "a", "\":", "4", "2", "}"}) {
    ASSERT_EQ(feed(s, {m->id_of(piece)}), TS_OK) << piece << ": " << t->last_error();
    text += piece;
    check();
  }
}

TEST_F(LlamaCppGrammar, RefusedTokenFailsPrefillAndMovesNothing) {
  ASSERT_EQ(set(s, kYesNo), TS_OK) << t->last_error();
  const Mask before = mask_of(s);
  EXPECT_EQ(feed(s, {m->id_of("x")}), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(t->last_error()).find("not allowed by the grammar"), std::string::npos)
      << t->last_error();
  EXPECT_EQ(t->position(s), start);
  EXPECT_EQ(mask_of(s), before);
  // The first token allowed, the second not: the whole call fails, nothing moves.
  EXPECT_EQ(feed(s, {m->id_of("n"), m->id_of("x")}), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->position(s), start);
  EXPECT_EQ(mask_of(s), before);
  float* out = logits.data();
  EXPECT_EQ(t->decode(s, m->id_of(" yes"), out), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->position(s), start);
}

TEST_F(LlamaCppGrammar, RewindRestoresTheMask) {
  ASSERT_EQ(set(s, kYesNo), TS_OK) << t->last_error();
  const Mask m0 = mask_of(s);
  ASSERT_EQ(feed(s, {m->id_of("n")}), TS_OK) << t->last_error();
  const Mask m1 = mask_of(s);
  ASSERT_NE(m0, m1);
  ASSERT_EQ(feed(s, {m->id_of("o")}), TS_OK) << t->last_error();
  ASSERT_EQ(t->rewind(s, start + 1), TS_OK) << t->last_error();
  EXPECT_EQ(mask_of(s), m1);
  ASSERT_EQ(t->rewind(s, start), TS_OK) << t->last_error();
  EXPECT_EQ(mask_of(s), m0);
  // The other branch after the rewind.
  ASSERT_EQ(feed(s, {m->id_of("ye")}), TS_OK) << t->last_error();
  expect_yes_no(s, "ye");
}

TEST_F(LlamaCppGrammar, ForkCopiesTheGrammar) {
  ASSERT_EQ(set(s, kYesNo), TS_OK) << t->last_error();
  const Mask m0 = mask_of(s);
  ASSERT_EQ(feed(s, {m->id_of("y")}), TS_OK) << t->last_error();
  const Mask m1 = mask_of(s);
  ts_session* whole = nullptr;
  ts_session* prefix = nullptr;
  ASSERT_EQ(t->fork_session(s, start + 1, &whole), TS_OK) << t->last_error();
  forks.push_back(whole);
  ASSERT_EQ(t->fork_session(s, start, &prefix), TS_OK) << t->last_error();
  forks.push_back(prefix);
  EXPECT_EQ(mask_of(whole), m1);
  EXPECT_EQ(mask_of(prefix), m0);
  // Independent: the fork goes on, the source does not move.
  ASSERT_EQ(feed(whole, {m->id_of("es")}), TS_OK) << t->last_error();
  expect_yes_no(whole, "yes");
  EXPECT_EQ(mask_of(s), m1);
  ASSERT_EQ(feed(prefix, {m->id_of("no")}), TS_OK) << t->last_error();
  expect_yes_no(prefix, "no");
}

TEST_F(LlamaCppGrammar, GrammarGreedyIsTheMaskedArgmax) {
  ASSERT_EQ(set(s, kYesNo), TS_OK) << t->last_error();
  ASSERT_EQ(feed(s, {m->id_of("y")}), TS_OK) << t->last_error();  // logits of this call
  const Mask mask = mask_of(s);
  int32_t pick = -2;
  ASSERT_EQ(t->grammar_greedy(s, 1, &pick), TS_OK) << t->last_error();
  ASSERT_GE(pick, 0);
  EXPECT_TRUE(allowed(mask, pick)) << pick;
  int32_t best = -1;
  for (int32_t i = 0; i < m->n_vocab; ++i)
    if (allowed(mask, i) && (best < 0 || logits[size_t(i)] > logits[size_t(best)])) best = i;
  EXPECT_EQ(pick, best);
  EXPECT_EQ(feed(s, {pick}), TS_OK) << t->last_error();
}

TEST_F(LlamaCppGrammar, StopTokenOnlyWhereTheGrammarMayEnd) {
  ASSERT_EQ(set(s, kYesNo), TS_OK) << t->last_error();
  const int32_t eos = m->tok->eos();
  EXPECT_FALSE(allowed(mask_of(s), eos));
  EXPECT_EQ(feed(s, {eos}), TS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(feed(s, {m->id_of("ye")}), TS_OK) << t->last_error();
  EXPECT_FALSE(allowed(mask_of(s), eos));
  ASSERT_EQ(feed(s, {m->id_of("s")}), TS_OK) << t->last_error();
  EXPECT_TRUE(allowed(mask_of(s), eos));
  ASSERT_EQ(feed(s, {eos}), TS_OK) << t->last_error();
  EXPECT_EQ(mask_of(s), Mask(size_t(TS_MASK_WORDS(m->n_vocab)), 0u));  // nothing after a stop
  EXPECT_EQ(feed(s, {eos}), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(feed(s, {m->id_of("y")}), TS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(t->rewind(s, start + 2), TS_OK) << t->last_error();  // before the stop token
  EXPECT_TRUE(allowed(mask_of(s), eos));
}

TEST_F(LlamaCppGrammar, BadGrammarsAndOtherKindsAreRefused) {
  EXPECT_EQ(set(s, "root ::= \"yes"), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(t->last_error()).find("llama.cpp"), std::string::npos) << t->last_error();
  EXPECT_EQ(set(s, "root ::= missing"), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(t->last_error()).find("missing"), std::string::npos) << t->last_error();
  EXPECT_EQ(set(s, "answer ::= \"yes\""), TS_ERR_INVALID_ARGUMENT);  // no root
  EXPECT_NE(std::string(t->last_error()).find("root"), std::string::npos) << t->last_error();
  EXPECT_EQ(set(s, ""), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(set(s, R"({"type": "string"})", TS_GRAMMAR_JSON_SCHEMA), TS_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(t->last_error()).find("json_schema"), std::string::npos);
  EXPECT_EQ(set(s, "[0-9]+", TS_GRAMMAR_REGEX), TS_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(t->last_error()).find("GBNF"), std::string::npos);
  // No grammar was set: the session takes any token.
  EXPECT_EQ(feed(s, {m->id_of("x")}), TS_OK) << t->last_error();
}

}  // namespace
