// reference_grammar.cpp - see reference_grammar.h.
#include "reference_grammar.h"

#include <array>
#include <vector>

#include "touchstone/grammar/oracle.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone::reference_backend {

struct GrammarTables {
  Tokenizer tokenizer;
  grammar::GrammarVocab vocab;
  // grammar_straddling_token: each text token's first byte (-1: none), and the
  // token whose bytes are exactly byte b (-1: none).
  std::vector<int16_t> first_byte;
  std::array<int32_t, 256> byte_token{};

  explicit GrammarTables(Tokenizer t) : tokenizer(std::move(t)), vocab(tokenizer) {
    byte_token.fill(-1);
    first_byte.assign(size_t(tokenizer.n_vocab()), -1);
    for (int32_t id = 0; id < tokenizer.n_vocab(); ++id) {
      if (!vocab.is_text(id)) continue;
      const std::string b = tokenizer.token_bytes(id);
      if (b.empty()) continue;
      first_byte[size_t(id)] = int16_t(uint8_t(b[0]));
      if (b.size() == 1 && byte_token[uint8_t(b[0])] < 0) byte_token[uint8_t(b[0])] = id;
    }
  }
};

std::shared_ptr<const GrammarTables> GrammarVocabulary::get() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tables_) {
    const gguf::File file = gguf::File::open_metadata(path_);
    tables_ = std::make_shared<const GrammarTables>(Tokenizer(tokenizer_data_from_gguf(file)));
  }
  return tables_;
}

namespace {

bool bit(const std::vector<uint32_t>& m, int32_t t) { return (m[size_t(t) / 32] >> (t % 32)) & 1u; }
void set_bit(uint32_t* m, int32_t t) { m[size_t(t) / 32] |= 1u << (t % 32); }

// The oracle's state plus what the faults add. Each accepted token is one
// entry: one token fed to the oracle, or (grammar_early_stop) a stop token the
// oracle refused, taken anyway.
class ReferenceGrammar final : public abi::GrammarState {
 public:
  ReferenceGrammar(std::shared_ptr<const GrammarTables> t, grammar::GrammarOracle o, Faults f)
      : tables_(std::move(t)), oracle_(std::move(o)), faults_(std::move(f)) {}

  bool accept(int32_t token) override {
    if (stopped_) return false;
    if (oracle_.accept(token)) {
      entries_.push_back(false);
      return true;
    }
    if (faults_.grammar_early_stop && tables_->vocab.is_stop(token)) {
      stopped_ = true;
      entries_.push_back(true);
      return true;
    }
    const int32_t head = straddled(token, oracle_.allowed_mask());
    if (head >= 0 && oracle_.accept(head)) {  // only the first byte reaches the grammar
      entries_.push_back(false);
      return true;
    }
    return false;
  }

  void rollback(int32_t n) override {
    if (faults_.grammar_draft_advance) return;  // the fault: the state stays where it was
    undo(oracle_, stopped_, entries_, n);
  }

  void mask(uint32_t* words, int32_t n_words) const override {
    if (faults_.grammar_mask_late && !entries_.empty()) {
      grammar::GrammarOracle before = oracle_.fork();
      bool stopped = stopped_;
      std::vector<bool> entries = entries_;
      undo(before, stopped, entries, 1);
      fill(before, stopped, words, n_words);
      return;
    }
    fill(oracle_, stopped_, words, n_words);
  }

  std::unique_ptr<abi::GrammarState> clone() const override {
    auto c = std::make_unique<ReferenceGrammar>(tables_, oracle_.fork(), faults_);
    c->entries_ = entries_;
    c->stopped_ = stopped_;
    return c;
  }

 private:
  static void undo(grammar::GrammarOracle& o, bool& stopped, std::vector<bool>& entries,
                   int32_t n) {
    for (int32_t i = 0; i < n && !entries.empty(); ++i) {
      if (entries.back())
        stopped = false;
      else
        o.rollback(1);
      entries.pop_back();
    }
  }

  // grammar_straddling_token: the single-byte token of `token`'s first byte when
  // that one is allowed and `token` itself is not; else -1.
  int32_t straddled(int32_t token, const std::vector<uint32_t>& allowed) const {
    if (!faults_.grammar_straddle || token < 0 || token >= tables_->vocab.n_vocab()) return -1;
    const int16_t b = tables_->first_byte[size_t(token)];
    if (b < 0 || bit(allowed, token)) return -1;
    const int32_t head = tables_->byte_token[size_t(b)];
    return head >= 0 && bit(allowed, head) ? head : -1;
  }

  void fill(const grammar::GrammarOracle& o, bool stopped, uint32_t* words, int32_t n) const {
    std::fill(words, words + n, 0u);
    if (stopped || o.is_terminated()) return;
    const std::vector<uint32_t> allowed = o.allowed_mask();
    std::copy(allowed.begin(), allowed.end(), words);
    if (faults_.grammar_straddle) {
      for (int32_t t = 0; t < tables_->vocab.n_vocab(); ++t)
        if (straddled(t, allowed) >= 0) set_bit(words, t);
    }
    if (faults_.grammar_early_stop)
      for (int32_t t : tables_->vocab.stop_tokens()) set_bit(words, t);
  }

  std::shared_ptr<const GrammarTables> tables_;
  grammar::GrammarOracle oracle_;
  Faults faults_;
  std::vector<bool> entries_;  // per accepted token: true = a stop the oracle refused
  bool stopped_ = false;
};

grammar::GrammarKind kind_of(ts_grammar_kind k) {
  switch (k) {
    case TS_GRAMMAR_JSON_SCHEMA:
      return grammar::GrammarKind::json_schema;
    case TS_GRAMMAR_REGEX:
      return grammar::GrammarKind::regex;
    case TS_GRAMMAR_GBNF:
      break;
  }
  return grammar::GrammarKind::gbnf;
}

}  // namespace

std::unique_ptr<abi::GrammarState> compile_grammar(std::shared_ptr<const GrammarTables> tables,
                                                   const ts_grammar& g, const Faults& faults) {
  try {
    grammar::GrammarOracle o(tables->vocab,
                             grammar::GrammarSpec{kind_of(g.kind), g.text, "set_grammar"});
    return std::make_unique<ReferenceGrammar>(std::move(tables), std::move(o), faults);
  } catch (const grammar::GrammarError& e) {
    throw abi::StatusError(TS_ERR_INVALID_ARGUMENT, e.what());
  }
}

}  // namespace touchstone::reference_backend
