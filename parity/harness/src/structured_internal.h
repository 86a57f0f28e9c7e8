// structured_internal.h - what the structured checks (structured.cpp,
// structured_serving.cpp) share: a sequence decoding under a grammar, and the
// result rows.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "touchstone/grammar/oracle.h"
#include "touchstone/harness/structured.h"

namespace touchstone::structured {

// One sequence under the case's grammar, from the end of the prompt on. With a
// backend that enforces grammars, the grammar is the session's (grammar_mask,
// grammar_greedy); otherwise the harness's oracle follows the tokens and its
// mask is applied to the rows. row() is the last position's logits.
class Sequence {
 public:
  // Opens a session, prefills the prompt and sets the grammar (or starts the oracle).
  Sequence(const BackendModel& model, const BackendSessionOptions& o, const GoldenCase& g,
           const grammar::GrammarVocab& vocab);
  // Adopts a session already holding the prompt (a step_batch participant).
  Sequence(std::unique_ptr<BackendSession> s, std::vector<float> row, const GoldenCase& g,
           const grammar::GrammarVocab& vocab);
  bool by_backend() const { return !oracle_; }
  // mask() is available: the oracle's, or a backend that exposes its sets.
  bool masks_exposed() const { return masks_exposed_; }
  std::vector<uint32_t> mask();
  // The constrained greedy pick of the current position (-1: nothing allowed).
  int32_t pick();
  // The picks of the last n positions of the last call (an all-position verify).
  std::vector<int32_t> picks(int32_t n, std::span<const int32_t> drafts,
                             std::span<const float> rows);
  void append(int32_t token);
  // Appends `tokens` in one all-position prefill; returns the rows.
  std::vector<float> verify(std::span<const int32_t> tokens);
  // Back to `steps` tokens after the prompt.
  void rewind(int32_t steps);
  std::unique_ptr<Sequence> fork(int32_t steps);
  std::span<const float> row() const { return row_; }
  void set_row(std::span<const float> r) { row_.assign(r.begin(), r.end()); }
  BackendSession& session() { return *session_; }
  int32_t steps() const { return session_->position() - prompt_; }
  // Tokens the session took in a call the Sequence did not make (step_batch):
  // the harness's oracle follows them (nothing to do when the backend enforces).
  void accepted_externally(std::span<const int32_t> tokens);

 private:
  Sequence() = default;
  std::unique_ptr<BackendSession> session_;
  std::optional<grammar::GrammarOracle> oracle_;
  std::vector<float> row_;
  int32_t prompt_ = 0;
  bool masks_exposed_ = true;
  void start_grammar(const GoldenCase& g, const grammar::GrammarVocab& vocab);
};

// The grammar's truth (the harness's oracle) along a token sequence.
grammar::GrammarOracle truth(const grammar::GrammarVocab& vocab, const GoldenCase& g);

// A result row "structured.<check>"; fail() records the first failing step.
CaseResult row(const std::string& check, bool backend);
void fail(CaseResult& r, int step, const std::string& what);
// `got` where `want` was expected at `step` of a sequence whose row is `row`: a
// near tie (recorded, true: the sequences part here) or a failure (false).
bool part_or_fail(CaseResult& r, const Tokenizer& tok, const Profile& p, bool exact, int step,
                  std::span<const float> row, int32_t want, int32_t got, const std::string& what);
std::string token_text(const Tokenizer& tok, int32_t t);
// "N vs M tokens; first difference: token T "..." (allowed by A only)".
std::string mask_difference(const Tokenizer& tok, std::span<const uint32_t> a,
                            std::span<const uint32_t> b, const char* a_name, const char* b_name);

// The plain constrained run (no drafts, no batch): its tokens, rows and masks.
struct PlainRun {
  std::vector<int32_t> tokens;               // picks, a stop token last if one was picked
  std::vector<std::vector<float>> rows;      // rows[i]: the logits tokens[i] was picked from
  std::vector<std::vector<uint32_t>> masks;  // masks[i]: the allowed set at step i (where exposed)
};
PlainRun plain_run(Sequence& s, const grammar::GrammarVocab& vocab, int max_steps);

CaseResult check_speculative(const BackendModel& model, const Tokenizer& tok, const GoldenCase& g,
                             const Profile& p, const StructuredOptions& o,
                             const grammar::GrammarVocab& vocab, bool exact);
CaseResult check_batch_isolation(const BackendModel& model, const Tokenizer& tok,
                                 const GoldenCase& g, const Profile& p, const StructuredOptions& o,
                                 const grammar::GrammarVocab& vocab, bool exact);

}  // namespace touchstone::structured
