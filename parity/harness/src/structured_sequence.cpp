// structured_sequence.cpp - a sequence decoding under a grammar, and the result
// rows of the structured checks (structured_internal.h).
#include <algorithm>
#include <cmath>

#include "structured_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone::structured {
namespace {

int32_t masked_argmax(std::span<const float> row, std::span<const uint32_t> mask) {
  std::vector<float> masked(row.begin(), row.end());
  if (grammar::apply_mask(mask, masked) == 0) return -1;
  const int32_t t = metrics::argmax(masked);
  return t >= 0 && grammar::mask_allows(mask, t) ? t : -1;
}

}  // namespace

grammar::GrammarOracle truth(const grammar::GrammarVocab& vocab, const GoldenCase& g) {
  return grammar::GrammarOracle(
      vocab,
      grammar::GrammarSpec{grammar::parse_grammar_kind(g.grammar_kind), g.grammar_text, g.name});
}

Sequence::Sequence(const BackendModel& model, const BackendSessionOptions& o, const GoldenCase& g,
                   const grammar::GrammarVocab& vocab) {
  session_ = std::make_unique<BackendSession>(model, o);
  row_ = session_->prefill(g.prompt_ids);
  prompt_ = int32_t(g.prompt_ids.size());
  start_grammar(g, vocab);
}

void Sequence::start_grammar(const GoldenCase& g, const grammar::GrammarVocab& vocab) {
  if (enforce_grammar(*session_, g) == kGrammarByHarness) {
    oracle_.emplace(truth(vocab, g));
  } else {
    masks_exposed_ = session_->exposed_grammar_mask().has_value();
  }
}

Sequence::Sequence(std::unique_ptr<BackendSession> s, std::vector<float> row, const GoldenCase& g,
                   const grammar::GrammarVocab& vocab)
    : session_(std::move(s)), row_(std::move(row)) {
  prompt_ = session_->position();
  start_grammar(g, vocab);
}

std::vector<uint32_t> Sequence::mask() {
  return oracle_ ? oracle_->allowed_mask() : session_->grammar_mask();
}

int32_t Sequence::pick() {
  if (!oracle_) return session_->grammar_greedy(1)[0];
  return masked_argmax(row_, oracle_->allowed_mask());
}

std::vector<int32_t> Sequence::picks(int32_t n, std::span<const int32_t> drafts,
                                     std::span<const float> rows) {
  if (!oracle_) return session_->grammar_greedy(n);
  // The oracle has taken the drafts: row i is judged in the state after drafts[0..i].
  std::vector<int32_t> out(size_t(n), -1);
  const size_t V = rows.size() / drafts.size();
  grammar::GrammarOracle o = oracle_->fork();
  o.rollback(int(drafts.size()));
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (!o.accept(drafts[i])) break;
    if (i + size_t(n) >= drafts.size())
      out[i + size_t(n) - drafts.size()] = masked_argmax(rows.subspan(i * V, V), o.allowed_mask());
  }
  return out;
}

void Sequence::accepted_externally(std::span<const int32_t> tokens) {
  for (int32_t t : tokens)
    if (oracle_ && !oracle_->accept(t)) throw Error("the grammar refuses token {}", t);
}

void Sequence::append(int32_t token) {
  if (oracle_ && !oracle_->accept(token))
    throw Error("the grammar refuses token {} at step {}", token, steps());
  session_->decode(token, row_);
}

std::vector<float> Sequence::verify(std::span<const int32_t> tokens) {
  for (size_t i = 0; oracle_ && i < tokens.size(); ++i) {
    if (!oracle_->accept(tokens[i])) {
      oracle_->rollback(int(i));
      throw Error("the grammar refuses draft {} (token {})", i, tokens[i]);
    }
  }
  std::vector<float> rows = session_->prefill_all(tokens);
  const size_t V = rows.size() / tokens.size();
  row_.assign(rows.end() - std::ptrdiff_t(V), rows.end());
  return rows;
}

void Sequence::rewind(int32_t steps) {
  const int32_t back = this->steps() - steps;
  session_->rewind(prompt_ + steps);
  if (oracle_) oracle_->rollback(back);
}

std::unique_ptr<Sequence> Sequence::fork(int32_t steps) {
  std::unique_ptr<Sequence> f(new Sequence());
  f->session_ = session_->fork(prompt_ + steps);
  f->prompt_ = prompt_;
  f->masks_exposed_ = masks_exposed_;
  if (oracle_) {
    f->oracle_.emplace(oracle_->fork());
    f->oracle_->rollback(this->steps() - steps);
  }
  return f;
}

CaseResult row(const std::string& check, bool backend) {
  CaseResult r;
  r.name = check;
  r.grammar_enforcement = backend ? kGrammarByBackend : kGrammarByHarness;
  return r;
}

void fail(CaseResult& r, int step, const std::string& what) {
  r.failures.push_back(fmt::format("{}: step {}: {}", r.name, step, what));
  r.violations.push_back({"structured", double(step), 0.0});
  if (r.first_logit_violation_step < 0) {
    r.first_logit_violation_step = step;
    r.first_logit_violation = what;
  }
}

std::string token_text(const Tokenizer& tok, int32_t t) {
  if (t < 0) return "(none)";
  return fmt::format("{} {:?}", t, tok.token_bytes(t));
}

bool part_or_fail(CaseResult& r, const Tokenizer& tok, const Profile& p, bool exact, int step,
                  std::span<const float> row, int32_t want, int32_t got, const std::string& what) {
  const double margin =
      want >= 0 && got >= 0 ? double(row[size_t(want)]) - double(row[size_t(got)]) : INFINITY;
  if (!exact && std::abs(margin) < p.near_tie_margin) {
    r.near_ties.push_back(GreedyDivergence{step, want, got, tok.token_bytes(want),
                                           got >= 0 ? tok.token_bytes(got) : "", margin, true, true,
                                           true});
    return true;
  }
  fail(r, step,
       fmt::format("{}: {} where {} was expected (margin {:.4g} nats in its row)", what,
                   token_text(tok, got), token_text(tok, want), margin));
  return false;
}

std::string mask_difference(const Tokenizer& tok, std::span<const uint32_t> a,
                            std::span<const uint32_t> b, const char* a_name, const char* b_name) {
  std::string s = fmt::format("{} {} tokens, {} {}", a_name, grammar::mask_count(a), b_name,
                              grammar::mask_count(b));
  for (size_t w = 0; w < std::min(a.size(), b.size()); ++w) {
    if (a[w] == b[w]) continue;
    const int32_t t = int32_t(w * 32) + __builtin_ctz(a[w] ^ b[w]);
    return s + fmt::format("; first difference: token {} (allowed by {} only)", token_text(tok, t),
                           grammar::mask_allows(a, t) ? a_name : b_name);
  }
  return s;
}

PlainRun plain_run(Sequence& s, const grammar::GrammarVocab& vocab, int max_steps) {
  PlainRun run;
  for (int i = 0; i < max_steps; ++i) {
    const int32_t t = s.pick();
    run.rows.emplace_back(s.row().begin(), s.row().end());
    if (s.masks_exposed()) run.masks.push_back(s.mask());
    run.tokens.push_back(t);
    if (t < 0 || vocab.is_stop(t)) break;
    if (i + 1 < max_steps) s.append(t);
  }
  return run;
}

}  // namespace touchstone::structured
