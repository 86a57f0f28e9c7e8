// llamacpp_issue18173_test.cpp - llama.cpp issue 18173 ("Unexpected empty
// grammar stack after accepting piece" with the stock json.gbnf on Gemma 3
// 270M): constrained greedy decoding from a plain prompt, 64 tokens, the logits
// from the backend's table and the allowed set from the grammar state
// (LlamaGrammar, compiled into this test so that llama.cpp's own exception text
// can be read), and the same run through the backend's set_grammar /
// grammar_greedy. The steps are printed. Skips, naming the path, without the model.
#include <gtest/gtest.h>
#include <llama.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "backend_table.h"
#include "llamacpp_grammar.h"
#include "touchstone/abi/backend_adapter.hpp"

namespace {

using touchstone::llamacpp::LlamaGrammar;
using touchstone::llamacpp::test::backend_table;

constexpr int kSteps = 64;
const char* kPrompt = "Describe a cat as JSON:";

std::string gemma_path() {
  const char* env = std::getenv("TOUCHSTONE_GEMMA_MODEL");
  return env && *env ? env : TOUCHSTONE_LLAMACPP_GEMMA_MODEL;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string piece(const llama_vocab* v, int32_t id) {
  char buf[256];
  const int32_t n = llama_token_to_piece(v, id, buf, sizeof buf, 0, true);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

// One constrained greedy run: the tokens and how it ended.
struct Decoded {
  std::vector<int32_t> tokens;
  std::string end;  // "stop token", "nothing allowed", "64 tokens", or the failure
  int failed_step = -1;
  int32_t failed_token = -1;
};

// Gemma 3 through the backend's table: a session with the prompt prefilled.
struct Gemma {
  const ts_backend* t = backend_table();
  ts_model* model = nullptr;
  llama_model* vocab_model = nullptr;  // llama.cpp's vocabulary, for the grammar state
  const llama_vocab* vocab = nullptr;
  int32_t n_vocab = 0;
  std::vector<int32_t> prompt;

  explicit Gemma(const std::string& path) {
    if (t->load_model(path.c_str(), &model) != TS_OK)
      throw std::runtime_error(std::string("load_model: ") + t->last_error());
    n_vocab = t->n_vocab(model);
    llama_model_params p = llama_model_default_params();
    p.vocab_only = true;
    vocab_model = llama_model_load_from_file(path.c_str(), p);
    if (!vocab_model) throw std::runtime_error("llama.cpp cannot load the vocabulary");
    vocab = llama_model_get_vocab(vocab_model);
    prompt.resize(64);
    const int32_t n = llama_tokenize(vocab, kPrompt, int32_t(std::string(kPrompt).size()),
                                     prompt.data(), int32_t(prompt.size()), true, false);
    if (n <= 0) throw std::runtime_error("llama_tokenize failed");
    prompt.resize(size_t(n));
  }
  ~Gemma() {
    llama_model_free(vocab_model);
    t->free_model(model);
  }
  ts_session* open(std::vector<float>& logits) const {
    ts_session_options o{};
    o.struct_size = sizeof o;
    o.weight_path = TS_WEIGHTS_QUANTIZED;
    o.n_threads = 2;
    o.max_context = 256;
    ts_session* s = nullptr;
    if (t->open_session(model, &o, &s) != TS_OK) throw std::runtime_error(t->last_error());
    logits.resize(size_t(n_vocab));
    if (t->prefill(s, prompt.data(), int32_t(prompt.size()), 0, logits.data()) != TS_OK)
      throw std::runtime_error(t->last_error());
    return s;
  }
};

// The grammar state's mask on the backend's logits, token by token.
Decoded run_with_state(const Gemma& g, LlamaGrammar& grammar) {
  std::vector<float> logits;
  ts_session* s = g.open(logits);
  std::vector<uint32_t> mask(size_t(TS_MASK_WORDS(g.n_vocab)));
  Decoded r;
  r.end = std::to_string(kSteps) + " tokens";
  for (int step = 0; step < kSteps; ++step) {
    grammar.mask(mask.data(), int32_t(mask.size()));
    const int32_t pick = touchstone::abi::masked_argmax(logits.data(), g.n_vocab, mask.data());
    if (pick < 0) {
      r.end = "nothing allowed";
      break;
    }
    if (!grammar.accept(pick)) {
      r.failed_step = step;
      r.failed_token = pick;
      r.end = "accept refused a token the mask allowed: " + grammar.last_failure();
      break;
    }
    r.tokens.push_back(pick);
    if (llama_vocab_is_eog(g.vocab, pick)) {
      r.end = "stop token";
      break;
    }
    if (g.t->decode(s, pick, logits.data()) != TS_OK) throw std::runtime_error(g.t->last_error());
  }
  g.t->free_session(s);
  return r;
}

// The same through the backend's own set_grammar / grammar_greedy / decode.
Decoded run_with_backend(const Gemma& g, const std::string& gbnf) {
  std::vector<float> logits;
  ts_session* s = g.open(logits);
  ts_grammar gr{};
  gr.struct_size = sizeof gr;
  gr.kind = TS_GRAMMAR_GBNF;
  gr.text = gbnf.c_str();
  if (g.t->set_grammar(s, &gr) != TS_OK) throw std::runtime_error(g.t->last_error());
  Decoded r;
  r.end = std::to_string(kSteps) + " tokens";
  for (int step = 0; step < kSteps; ++step) {
    int32_t pick = -1;
    if (g.t->grammar_greedy(s, 1, &pick) != TS_OK) throw std::runtime_error(g.t->last_error());
    if (pick < 0) {
      r.end = "nothing allowed";
      break;
    }
    if (g.t->decode(s, pick, logits.data()) != TS_OK) {
      r.failed_step = step;
      r.failed_token = pick;
      r.end = g.t->last_error();
      break;
    }
    r.tokens.push_back(pick);
    if (llama_vocab_is_eog(g.vocab, pick)) {
      r.end = "stop token";
      break;
    }
  }
  g.t->free_session(s);
  return r;
}

void print(const Gemma& g, const char* name, const Decoded& r) {
  std::string text;
  std::cout << name << ": " << r.tokens.size() << " tokens, end: " << r.end << "\n  ids:";
  for (int32_t id : r.tokens) {
    std::cout << ' ' << id;
    text += piece(g.vocab, id);
  }
  std::cout << "\n  text: " << text << "\n";
  if (r.failed_step >= 0) {
    std::cout << "  failed at step " << r.failed_step << ", token " << r.failed_token << " '"
              << piece(g.vocab, r.failed_token) << "'\n";
  }
}

TEST(LlamaCppIssue18173, JsonGbnfOnGemma3ConstrainedGreedy) {
  const std::string path = gemma_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  const Gemma g(path);
  const std::string gbnf = read_file(TOUCHSTONE_LLAMACPP_JSON_GBNF);
  std::string error;
  std::unique_ptr<LlamaGrammar> grammar = touchstone::llamacpp::compile_gbnf(g.vocab, gbnf, error);
  ASSERT_TRUE(grammar) << error;
  const Decoded state = run_with_state(g, *grammar);
  print(g, "grammar state", state);
  const Decoded backend = run_with_backend(g, gbnf);
  print(g, "backend", backend);
  // llama.cpp's accept takes every token its own mask allows (no "Unexpected
  // empty grammar stack"), and the backend's table decodes the same tokens.
  EXPECT_EQ(state.failed_step, -1) << state.end;
  EXPECT_EQ(backend.failed_step, -1) << backend.end;
  EXPECT_EQ(state.tokens, backend.tokens);
  EXPECT_FALSE(state.tokens.empty());
}

// What the issue's stack trace shows: llama.cpp's grammar sampler handed a
// token its mask refuses. The unconstrained greedy token after the prompt is
// checked against the grammar state's mask, then given to a fresh llama.cpp
// grammar sampler's accept directly (never a stop token: that aborts).
TEST(LlamaCppIssue18173, UnmaskedTokenThrowsInLlamaCppAccept) {
  const std::string path = gemma_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  const Gemma g(path);
  const std::string gbnf = read_file(TOUCHSTONE_LLAMACPP_JSON_GBNF);
  std::string error;
  std::unique_ptr<LlamaGrammar> grammar = touchstone::llamacpp::compile_gbnf(g.vocab, gbnf, error);
  ASSERT_TRUE(grammar) << error;
  std::vector<float> logits;
  ts_session* s = g.open(logits);
  g.t->free_session(s);
  const int32_t pick = touchstone::abi::greedy_argmax(logits.data(), g.n_vocab);
  ASSERT_FALSE(llama_vocab_is_eog(g.vocab, pick));
  std::cout << "unconstrained greedy token " << pick << " '" << piece(g.vocab, pick)
            << "', allowed by json.gbnf: " << grammar->allows(pick) << "\n";
  if (grammar->allows(pick)) GTEST_SKIP() << "the unconstrained pick is allowed";
  EXPECT_FALSE(grammar->accept(pick));
  EXPECT_TRUE(grammar->last_failure().empty());  // refused by the mask, llama.cpp never saw it
  llama_sampler* raw = llama_sampler_init_grammar(g.vocab, gbnf.c_str(), "root");
  ASSERT_NE(raw, nullptr);
  std::string thrown;
  try {
    llama_sampler_accept(raw, pick);
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  llama_sampler_free(raw);
  std::cout << "llama_sampler_accept(" << pick
            << "): " << (thrown.empty() ? "no exception" : thrown) << "\n";
  EXPECT_NE(thrown.find("Unexpected empty grammar stack after accepting piece"), std::string::npos)
      << thrown;
}

}  // namespace
