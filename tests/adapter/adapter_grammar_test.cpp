// BackendAdapter's ABI v7 members (touchstone/abi/backend_adapter.hpp): a
// Session::compile_grammar becomes set_grammar / grammar_mask / grammar_greedy
// and TS_CAP_STRUCTURED_OUTPUT, and the adapter keeps the grammar in step with
// prefill, decode, step_batch, rewind and fork. A toy grammar over 6 tokens:
// every token must be larger than the one before; 0 is the stop token, allowed
// after two tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/abi/backend_adapter.hpp"

namespace {

constexpr int32_t kVocab = 6;

class Ascending final : public touchstone::abi::GrammarState {
 public:
  bool accept(int32_t t) override {
    if (!allowed(t)) return false;
    taken_.push_back(t);
    return true;
  }
  void rollback(int32_t n) override { taken_.resize(taken_.size() - size_t(n)); }
  void mask(uint32_t* words, int32_t n_words) const override {
    for (int32_t w = 0; w < n_words; ++w) words[w] = 0;
    for (int32_t t = 0; t < kVocab; ++t)
      if (allowed(t)) words[t / 32] |= 1u << (t % 32);
  }
  std::unique_ptr<GrammarState> clone() const override {
    return std::make_unique<Ascending>(*this);
  }

 private:
  bool allowed(int32_t t) const {
    if (!taken_.empty() && taken_.back() == 0) return false;  // nothing after the stop
    if (t == 0) return taken_.size() >= 2;
    return taken_.empty() || t > taken_.back();
  }
  std::vector<int32_t> taken_;
};

// Logits of position p: token t scores 10 - |t - (p % kVocab)|.
void fill(int32_t pos, float* out) {
  for (int32_t t = 0; t < kVocab; ++t) out[t] = 10.0f - float(std::abs(t - pos % kVocab));
}

struct Grammared {
  static constexpr const char* name = "grammared";
  static constexpr const char* version = "7";
  struct Model {
    int32_t n_vocab() const { return kVocab; }
  };
  struct Session {
    int32_t pos = 0;
    int32_t position() const { return pos; }
    int32_t max_context() const { return 64; }
    void prefill(std::span<const int32_t> t, bool all, float* logits) {
      for (size_t i = 0; i < t.size(); ++i) fill(pos++, all ? logits + i * kVocab : logits);
    }
    void rewind(int32_t p) { pos = p; }
    std::unique_ptr<Session> fork(int32_t n) { return std::make_unique<Session>(Session{n}); }
    std::unique_ptr<touchstone::abi::GrammarState> compile_grammar(const ts_grammar& g) {
      if (std::string(g.text) != "ascending")
        throw touchstone::abi::StatusError(TS_ERR_INVALID_ARGUMENT, "unknown grammar");
      return std::make_unique<Ascending>();
    }
  };
  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    for (const auto& it : items) it.session->prefill(it.tokens, it.all_positions, it.logits);
  }
  static std::string device_name() { return "toy"; }
  static void capabilities(ts_capabilities& c) { c.flags = TS_CAP_ALL_POSITION_LOGITS; }
  static std::unique_ptr<Model> load_model(const std::string&) { return std::make_unique<Model>(); }
  static std::unique_ptr<Session> open_session(Model&, const ts_session_options&) {
    return std::make_unique<Session>();
  }
};

struct Fixture {
  const ts_backend* t = touchstone::BackendAdapter<Grammared>::table();
  ts_model* model = nullptr;
  std::vector<ts_session*> sessions;
  Fixture() { EXPECT_EQ(t->load_model("m.gguf", &model), TS_OK); }
  ts_session* open() {
    ts_session_options o{sizeof o, TS_WEIGHTS_FULL_PRECISION, 0, 0, nullptr};
    ts_session* s = nullptr;
    EXPECT_EQ(t->open_session(model, &o, &s), TS_OK);
    sessions.push_back(s);
    return s;
  }
  ~Fixture() {
    for (ts_session* s : sessions) t->free_session(s);
    t->free_model(model);
  }
  ts_status set(ts_session* s, const char* text = "ascending") {
    const ts_grammar g{sizeof(ts_grammar), TS_GRAMMAR_GBNF, text};
    return t->set_grammar(s, &g);
  }
  uint32_t mask(ts_session* s) {
    uint32_t m = 0xdeadbeef;
    EXPECT_EQ(t->grammar_mask(s, &m, 1), TS_OK) << t->last_error();
    return m;
  }
  ts_status decode(ts_session* s, int32_t token) {
    float l[kVocab];
    return t->decode(s, token, l);
  }
};

uint32_t bits(std::initializer_list<int32_t> tokens) {
  uint32_t m = 0;
  for (int32_t t : tokens) m |= 1u << t;
  return m;
}

TEST(AdapterGrammar, MembersAndFlagFollowCompileGrammar) {
  Fixture f;
  EXPECT_EQ(f.t->api_version, uint32_t(TS_BACKEND_API_VERSION));
  ASSERT_NE(f.t->set_grammar, nullptr);
  ASSERT_NE(f.t->grammar_mask, nullptr);
  ASSERT_NE(f.t->grammar_greedy, nullptr);
  ts_capabilities c{};
  c.struct_size = sizeof c;
  ASSERT_EQ(f.t->capabilities(&c), TS_OK);
  EXPECT_TRUE(c.flags & TS_CAP_STRUCTURED_OUTPUT);
}

TEST(AdapterGrammar, AppendedTokensGoThroughTheGrammarAndARefusalMovesNothing) {
  Fixture f;
  ts_session* s = f.open();
  const int32_t prompt[2] = {5, 5};  // before the grammar: anything goes
  float l[kVocab];
  ASSERT_EQ(f.t->prefill(s, prompt, 2, 0, l), TS_OK);
  ASSERT_EQ(f.set(s), TS_OK);
  EXPECT_EQ(f.mask(s), bits({1, 2, 3, 4, 5}));
  ASSERT_EQ(f.decode(s, 2), TS_OK);
  EXPECT_EQ(f.mask(s), bits({3, 4, 5}));
  EXPECT_EQ(f.decode(s, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(f.t->last_error(),
               "decode: token #0 = 1 is not allowed by the grammar at position 3");
  EXPECT_EQ(f.t->position(s), 3);
  const int32_t two[2] = {3, 2};  // the second refused: the first is undone too
  EXPECT_EQ(f.t->prefill(s, two, 2, 0, l), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(f.t->position(s), 3);
  EXPECT_EQ(f.mask(s), bits({3, 4, 5}));
  ASSERT_EQ(f.decode(s, 4), TS_OK);
  EXPECT_EQ(f.mask(s), bits({0, 5}));  // two tokens: the stop may follow
  ASSERT_EQ(f.decode(s, 0), TS_OK);
  EXPECT_EQ(f.mask(s), 0u);
  EXPECT_EQ(f.decode(s, 5), TS_ERR_INVALID_ARGUMENT);  // nothing after the stop
}

TEST(AdapterGrammar, GreedyIsTheMaskedArgmaxOfTheLastCallsRows) {
  Fixture f;
  ts_session* s = f.open();
  float l[3 * kVocab];
  const int32_t p[1] = {1};
  ASSERT_EQ(f.t->prefill(s, p, 1, 0, l), TS_OK);  // row of position 0 peaks at token 0
  ASSERT_EQ(f.set(s), TS_OK);
  int32_t pick = -2;
  ASSERT_EQ(f.t->grammar_greedy(s, 1, &pick), TS_OK) << f.t->last_error();
  EXPECT_EQ(pick, 1);  // 0 (the stop) is not allowed yet; 1 scores 9
  const int32_t drafts[3] = {1, 2, 3};
  ASSERT_EQ(f.t->prefill(s, drafts, 3, 1, l), TS_OK);  // rows of positions 1, 2, 3
  int32_t picks[3] = {-2, -2, -2};
  ASSERT_EQ(f.t->grammar_greedy(s, 3, picks), TS_OK) << f.t->last_error();
  // After 1 (row peaks at 1): > 1 allowed, 2 scores 9. After 1,2 (row peaks at 2):
  // 0 now allowed too, 3 scores 9. After 1,2,3 (row peaks at 3): 4 scores 9.
  EXPECT_EQ(picks[0], 2);
  EXPECT_EQ(picks[1], 3);
  EXPECT_EQ(picks[2], 4);
  EXPECT_EQ(f.t->grammar_greedy(s, 4, picks), TS_ERR_INVALID_ARGUMENT);
}

TEST(AdapterGrammar, RewindAndForkCarryTheStateBack) {
  Fixture f;
  ts_session* s = f.open();
  const int32_t p[1] = {5};
  float l[kVocab];
  ASSERT_EQ(f.t->prefill(s, p, 1, 0, l), TS_OK);
  ASSERT_EQ(f.set(s), TS_OK);
  ASSERT_EQ(f.decode(s, 1), TS_OK);
  ASSERT_EQ(f.decode(s, 3), TS_OK);
  ts_session* fork = nullptr;
  ASSERT_EQ(f.t->fork_session(s, 2, &fork), TS_OK);
  f.sessions.push_back(fork);
  EXPECT_EQ(f.mask(fork), bits({2, 3, 4, 5}));  // after 1 only
  ASSERT_EQ(f.decode(fork, 2), TS_OK);          // the fork advances alone
  EXPECT_EQ(f.mask(s), bits({0, 4, 5}));
  ASSERT_EQ(f.t->rewind(s, 2), TS_OK);
  EXPECT_EQ(f.mask(s), bits({2, 3, 4, 5}));
  ASSERT_EQ(f.t->rewind(s, 0), TS_OK);  // before the grammar was set: removed
  uint32_t m = 0;
  EXPECT_EQ(f.t->grammar_mask(s, &m, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(f.t->last_error(), "grammar_mask: no grammar set on the session");
  ASSERT_EQ(f.decode(s, 5), TS_OK);  // and nothing is enforced
}

TEST(AdapterGrammar, AStepBatchRefusalNamesTheEntryAndUndoesEveryEntry) {
  Fixture f;
  ts_session* a = f.open();
  ts_session* b = f.open();
  ASSERT_EQ(f.set(a), TS_OK);
  ASSERT_EQ(f.set(b), TS_OK);
  ASSERT_EQ(f.decode(b, 3), TS_OK);
  const int32_t ta[1] = {2}, tb[1] = {1};
  float la[kVocab], lb[kVocab];
  const ts_batch_entry e[2] = {{sizeof(ts_batch_entry), a, ta, 1, 0, la},
                               {sizeof(ts_batch_entry), b, tb, 1, 0, lb}};
  EXPECT_EQ(f.t->step_batch(e, 2), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(f.t->last_error(),
               "step_batch: entry 1: token #0 = 1 is not allowed by the grammar at position 1");
  EXPECT_EQ(f.t->position(a), 0);
  EXPECT_EQ(f.mask(a), bits({1, 2, 3, 4, 5}));  // entry 0's token undone
}

TEST(AdapterGrammar, SetGrammarErrors) {
  Fixture f;
  ts_session* s = f.open();
  EXPECT_EQ(f.set(s, "nonsense"), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(f.t->last_error(), "unknown grammar");
  ts_grammar bad_kind{sizeof(ts_grammar), TS_GRAMMAR_GBNF, "ascending"};
  const int seven = 7;  // as a C caller may pass it
  std::memcpy(&bad_kind.kind, &seven, sizeof seven);
  EXPECT_EQ(f.t->set_grammar(s, &bad_kind), TS_ERR_INVALID_ARGUMENT);
  const ts_grammar no_text{sizeof(ts_grammar), TS_GRAMMAR_GBNF, nullptr};
  EXPECT_EQ(f.t->set_grammar(s, &no_text), TS_ERR_INVALID_ARGUMENT);
  int32_t pick = 0;
  EXPECT_EQ(f.t->grammar_greedy(s, 1, &pick), TS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(f.set(s), TS_OK);
  EXPECT_EQ(f.t->set_grammar(s, nullptr), TS_OK);  // removed
  EXPECT_EQ(f.t->grammar_mask(s, reinterpret_cast<uint32_t*>(&pick), 1), TS_ERR_INVALID_ARGUMENT);
}

}  // namespace
