// server_grammar_test.cpp - the http:// backend's grammar picks
// (parity/runtime/src/http_grammar.h) against a scripted server.
#include <gtest/gtest.h>

#include <vector>

#include "http_grammar.h"
#include "touchstone/runtime/backend_channel.h"

namespace touchstone::http {
namespace {

constexpr int32_t kStop = 2;

// A server whose constrained continuation of any prompt is 10, 11, ..., 10 + n - 1
// then the stop token: `length` tokens and the stop; counts its generations.
struct Scripted {
  int32_t length = 5;
  int calls = 0;
  std::vector<int32_t> asked;  // n_predict of each call
  Generate fn() {
    return [this](std::span<const int32_t>, const GrammarField&, int32_t n_predict) {
      ++calls;
      asked.push_back(n_predict);
      Continuation c;
      for (int32_t i = 0; i < length && int32_t(c.tokens.size()) < n_predict; ++i)
        c.tokens.push_back(10 + i);
      if (int32_t(c.tokens.size()) < n_predict) c.tokens.push_back(kStop), c.ended = true;
      return c;
    };
  }
};

GrammarField gbnf() { return {"grammar", std::string("root ::= [a-z]+")}; }

TEST(ServerGrammar, PicksFollowTheServersOwnContinuation) {
  Scripted server;
  ServerGrammar g;
  std::vector<int32_t> seq = {1, 7, 8};  // the prompt; the grammar set at 3
  int32_t pick = -9;
  g.picks(seq, 3, gbnf(), 100, server.fn(), {&pick, 1});
  EXPECT_EQ(pick, 10);
  seq.push_back(10);
  seq.push_back(11);
  std::vector<int32_t> two(2, -9);  // the rows after 10 and after 11
  g.picks(seq, 3, gbnf(), 100, server.fn(), two);
  EXPECT_EQ(two, (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(server.calls, 1);  // one generation answers every pick
}

TEST(ServerGrammar, AfterTheStopTokenNothingAndBeforeTheGrammarNothing) {
  Scripted server;
  server.length = 2;
  ServerGrammar g;
  std::vector<int32_t> seq = {1, 7, 10, 11, kStop};
  std::vector<int32_t> out(4, -9);  // rows after 7 (before the grammar), 10, 11, stop
  g.picks(seq, 2, gbnf(), 100, server.fn(), out);
  EXPECT_EQ(out, (std::vector<int32_t>{10, 11, kStop, -1}));
  std::vector<int32_t> early(5, -9);
  g.picks(seq, 2, gbnf(), 100, server.fn(), early);
  EXPECT_EQ(early[0], -1);  // the row after token 0 precedes set_grammar's position
}

TEST(ServerGrammar, LengthensTheContinuationOnDemandWithinTheContext) {
  Scripted server;
  server.length = 100;
  ServerGrammar g;
  std::vector<int32_t> seq = {1};
  for (int32_t i = 0; i < 40; ++i) seq.push_back(10 + i);
  int32_t pick = -9;
  g.picks(seq, 1, gbnf(), 1000, server.fn(), {&pick, 1});
  EXPECT_EQ(pick, 50);
  ASSERT_EQ(server.asked.size(), 1u);
  EXPECT_EQ(server.asked[0], 41);
  seq.push_back(50);
  g.picks(seq, 1, gbnf(), 1000, server.fn(), {&pick, 1});
  EXPECT_EQ(server.asked.back(), 82);  // twice what it held
  try {
    ServerGrammar fresh;  // a context leaving 30 new tokens, 42 needed
    fresh.picks(seq, 1, gbnf(), 30, server.fn(), {&pick, 1});
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_CONTEXT_FULL);
  }
}

TEST(ServerGrammar, APickAfterATokenTheServerDidNotGenerateIsUnsupported) {
  Scripted server;
  ServerGrammar g;
  const std::vector<int32_t> seq = {1, 10, 99};
  int32_t pick = -9;
  try {
    g.picks(seq, 1, gbnf(), 100, server.fn(), {&pick, 1});
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("step 1 after set_grammar holds token 99"),
              std::string::npos)
        << e.what();
  }
}

TEST(ServerGrammar, AnotherGrammarOrPromptIsAnotherGeneration) {
  Scripted server;
  ServerGrammar g;
  int32_t pick = -9;
  g.picks(std::vector<int32_t>{1}, 1, gbnf(), 100, server.fn(), {&pick, 1});
  g.picks(std::vector<int32_t>{1}, 1, {"grammar", std::string("root ::= \"x\"")}, 100, server.fn(),
          {&pick, 1});
  g.picks(std::vector<int32_t>{3}, 1, gbnf(), 100, server.fn(), {&pick, 1});
  g.picks(std::vector<int32_t>{1}, 1, gbnf(), 100, server.fn(), {&pick, 1});
  EXPECT_EQ(server.calls, 3);
}

TEST(ServerGrammar, FieldsForEachKind) {
  ts_grammar t{sizeof(ts_grammar), TS_GRAMMAR_GBNF, "root ::= \"a\""};
  EXPECT_EQ(grammar_field(t).name, "grammar");
  t.kind = TS_GRAMMAR_JSON_SCHEMA;
  t.text = R"({"type": "object", "properties": {"z": {}, "a": {}}})";
  const GrammarField f = grammar_field(t);
  EXPECT_EQ(f.name, "json_schema");
  EXPECT_EQ(f.value["properties"].begin().key(), "z");  // the schema's order kept
  t.text = R"({"type": )";
  try {
    grammar_field(t);
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("byte 10"), std::string::npos) << e.what();
  }
  t.text = "[1, 2]";
  EXPECT_THROW(grammar_field(t), BackendError);
  t.kind = TS_GRAMMAR_REGEX;
  t.text = "[0-9]+";
  try {
    grammar_field(t);
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_UNSUPPORTED);
  }
}

}  // namespace
}  // namespace touchstone::http
