// llamacpp_grammar.cpp - see llamacpp_grammar.h.
#include "llamacpp_grammar.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <utility>

namespace touchstone::llamacpp {
namespace {

using touchstone::abi::StatusError;

SamplerPtr clone_sampler(const llama_sampler* s) {
  SamplerPtr out(llama_sampler_clone(s));
  if (!out) throw StatusError(TS_ERR_INTERNAL, "llama_sampler_clone of a grammar failed");
  return out;
}

// Runs f with file descriptor 2 sent to a temporary file and returns what was
// written there: llama.cpp's GBNF parser prints its error message with
// fprintf(stderr) (llama_grammar_parser::parse), not through the log callback.
// Output of other threads in that window is taken as well (and dropped).
template <class F>
std::string capture_stderr(F&& f) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  const int saved = tmp ? ::dup(2) : -1;
  if (saved < 0 || ::dup2(::fileno(tmp), 2) < 0) {
    if (saved >= 0) ::close(saved);
    if (tmp) std::fclose(tmp);
    f();  // not captured: llama.cpp's message reaches stderr
    return "";
  }
  struct Restore {
    int saved;
    std::FILE* tmp;
    ~Restore() {
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::close(saved);
    }
  };
  {
    Restore restore{saved, tmp};
    f();
  }
  std::string text;
  std::rewind(tmp);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, tmp)) > 0;) text.append(buf, n);
  std::fclose(tmp);
  return text;
}

// "expecting name at ..." from llama.cpp's "parse: error parsing grammar:
// <message>\n\n<grammar>\n": the first line of the message, at most 200 bytes.
std::string parse_message(const std::string& printed) {
  static const std::string kTag = "error parsing grammar: ";
  const size_t at = printed.find(kTag);
  if (at == std::string::npos) return "";
  const size_t from = at + kTag.size();
  const size_t end = printed.find('\n', from);
  std::string line = printed.substr(from, end == std::string::npos ? end : end - from);
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return line;
}

}  // namespace

LlamaGrammar::LlamaGrammar(const llama_vocab* vocab, std::shared_ptr<const llama_sampler> initial)
    : vocab_(vocab),
      n_vocab_(llama_vocab_n_tokens(vocab)),
      initial_(std::move(initial)),
      sampler_(clone_sampler(initial_.get())) {}

LlamaGrammar::LlamaGrammar(const LlamaGrammar& other)
    : touchstone::abi::GrammarState(),
      vocab_(other.vocab_),
      n_vocab_(other.n_vocab_),
      initial_(other.initial_),
      sampler_(clone_sampler(other.sampler_.get())),
      tokens_(other.tokens_),
      mask_(other.mask_),
      mask_valid_(other.mask_valid_) {}

bool LlamaGrammar::stopped() const {
  return !tokens_.empty() && llama_vocab_is_eog(vocab_, tokens_.back());
}

void LlamaGrammar::compute_mask() const {
  mask_.assign(size_t(TS_MASK_WORDS(n_vocab_)), 0u);
  if (!stopped()) {
    // Every token with logit 0; the grammar sets the ones it refuses to -inf
    // (a stop token unless the grammar may end here, a token with no text).
    std::vector<llama_token_data> cand(static_cast<size_t>(n_vocab_));
    for (int32_t i = 0; i < n_vocab_; ++i) cand[size_t(i)] = {i, 0.0f, 0.0f};
    llama_token_data_array arr{cand.data(), cand.size(), -1, false};
    llama_sampler_apply(sampler_.get(), &arr);
    for (size_t i = 0; i < arr.size; ++i) {
      const llama_token id = arr.data[i].id;
      if (std::isfinite(arr.data[i].logit) && id >= 0 && id < n_vocab_)
        mask_[size_t(id) / 32] |= 1u << (id % 32);
    }
  }
  mask_valid_ = true;
}

bool LlamaGrammar::allows(int32_t token) const {
  if (token < 0 || token >= n_vocab_) return false;
  if (!mask_valid_) compute_mask();
  return (mask_[size_t(token) / 32] >> (token % 32)) & 1u;
}

bool LlamaGrammar::accept(int32_t token) {
  last_failure_.clear();
  // Never a refused token: llama.cpp aborts on a stop token where the grammar
  // may not end and throws (its stacks emptied) on any other.
  if (!allows(token)) return false;
  try {
    llama_sampler_accept(sampler_.get(), token);
  } catch (const std::exception& e) {
    // Its own mask allowed the token (llama.cpp issue 18173's message): the
    // state is rebuilt and the token refused.
    last_failure_ = e.what();
    sampler_ = replay();
    return false;
  }
  tokens_.push_back(token);
  mask_valid_ = false;
  return true;
}

SamplerPtr LlamaGrammar::replay() const {
  SamplerPtr s = clone_sampler(initial_.get());
  for (int32_t t : tokens_) {
    // A stop token (always the last) changes nothing in llama.cpp's state.
    if (!llama_vocab_is_eog(vocab_, t)) llama_sampler_accept(s.get(), t);
  }
  return s;
}

void LlamaGrammar::rollback(int32_t n) {
  if (n == 0) return;
  if (n < 0 || size_t(n) > tokens_.size()) {
    throw StatusError(TS_ERR_INTERNAL, "grammar rollback of " + std::to_string(n) + " tokens, " +
                                           std::to_string(tokens_.size()) + " accepted");
  }
  tokens_.resize(tokens_.size() - size_t(n));
  sampler_ = replay();
  mask_valid_ = false;
  last_failure_.clear();
}

void LlamaGrammar::mask(uint32_t* words, int32_t n_words) const {
  if (!mask_valid_) compute_mask();
  for (int32_t i = 0; i < n_words; ++i) words[i] = size_t(i) < mask_.size() ? mask_[size_t(i)] : 0u;
}

std::unique_ptr<touchstone::abi::GrammarState> LlamaGrammar::clone() const {
  return std::unique_ptr<LlamaGrammar>(new LlamaGrammar(*this));
}

std::unique_ptr<LlamaGrammar> compile_gbnf(const llama_vocab* vocab, const std::string& text,
                                           std::string& error) {
  // llama.cpp takes an empty text as "no grammar" (everything allowed).
  if (text.empty()) {
    error = "empty grammar";
    return nullptr;
  }
  llama_sampler* raw = nullptr;
  const std::string printed =
      capture_stderr([&] { raw = llama_sampler_init_grammar(vocab, text.c_str(), "root"); });
  if (!raw) {
    error = parse_message(printed);
    return nullptr;
  }
  std::shared_ptr<const llama_sampler> initial(
      raw, [](const llama_sampler* s) { llama_sampler_free(const_cast<llama_sampler*>(s)); });
  return std::make_unique<LlamaGrammar>(vocab, std::move(initial));
}

}  // namespace touchstone::llamacpp
