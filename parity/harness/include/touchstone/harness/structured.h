// touchstone/harness/structured.h - structured output: who applies a case's
// grammar, and the golden-free checks of constrained decoding
// (docs/structured-output.md#checks).
//
// A backend with ABI v7 set_grammar (TS_CAP_STRUCTURED_OUTPUT) enforces the
// grammar itself: the harness hands it the grammar and judges its own allowed
// sets (grammar_mask) and picks (grammar_greedy). Any other backend returns
// logits only: the harness applies the oracle's mask (parity/grammar) to them.
// Reports say which ("enforced by the backend" / "applied by the harness").
//
// The checks run on one grammar case of the goldens: its prompt and its golden
// constrained continuation G (teacher-forced where a check follows it). Each is
// one CaseResult named "structured.<check>"; a failure names the step (position
// after the prompt, first_logit_violation_step) and the tokens with their bytes:
//   structured.mask_parity         the enforcing side's allowed set at every step of
//                                  G equals the golden's (from check_case)
//   structured.constrained_greedy  the constrained pick at every step equals G's
//                                  token (the near-tie rule on non-exact profiles)
//   structured.termination         a stop token is allowed only where the grammar may
//                                  end (the oracle's can_terminate), and after G's
//                                  stop token nothing is (the backend refuses more)
//   structured.non_interference    where the unconstrained argmax is a token the
//                                  grammar allows, the constrained pick is that token
//                                  (llama.cpp issue 8711's shape)
//   structured.rollback            after rewind, and in a fork, the allowed set at a
//                                  position equals the one first seen there
//   structured.speculative         drafts from the constrained sequence, each round with
//                                  one wrong (grammar-allowed) token, verified by one
//                                  all-position prefill and rewound: the accepted
//                                  tokens equal the constrained sequence without drafts
//                                  and the allowed sets after each rewind are the ones
//                                  first seen (vLLM PRs 14702, 48516)
//   structured.batch_isolation     a constrained and an unconstrained sequence decoding
//                                  in one step_batch each give what they give alone
//                                  (vLLM PR 22896)
// Token comparisons are exact where the backend claims TS_CAP_BATCH_INVARIANT for
// the path (or both sides ran the same calls); otherwise a differing pick whose
// margin in the sequence's own row is below the profile's near_tie_margin is a
// near tie (kept in near_ties), not a failure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "touchstone/golden/golden.h"
#include "touchstone/harness/parity.h"
#include "touchstone/model/tokenizer.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

inline constexpr const char* kGrammarByBackend = "enforced by the backend";
inline constexpr const char* kGrammarByHarness = "applied by the harness";
// The reason of the checks that need the backend's allowed sets, where a
// backend enforces grammars without exposing them (grammar_mask
// TS_ERR_UNSUPPORTED: a completion server); CaseResult::not_supported.
inline constexpr const char* kMaskParityNotExposed =
    "structured.mask_parity (the backend enforces the grammar without exposing its allowed sets)";

// The ABI kind of a manifest / golden grammar kind ("json_schema", "gbnf",
// "regex"); Error for another name.
ts_grammar_kind abi_grammar_kind(std::string_view kind);

// When the session's backend enforces grammars, sets g's grammar on it at its
// current position and returns kGrammarByBackend; else kGrammarByHarness.
std::string enforce_grammar(BackendSession& session, const GoldenCase& g);

// Every structured check's name, in the order above.
const std::vector<std::string>& structured_check_names();

struct StructuredOptions {
  BackendSessionOptions session;    // weight path, threads, max context
  std::vector<std::string> checks;  // names from structured_check_names(); empty = all
  int max_steps = 24;               // of G followed by the checks that walk it
  int draft_length = 4;             // structured.speculative: drafts per round (>= 2)
  bool by_backend = false;          // set by check_structured: who applies the grammar
  bool backend_masks = false;       // set by check_structured: the backend exposes its sets
};

// The checks on grammar case g (g.has_grammar(), Error otherwise) of `model`.
// Backend errors inside a check fail that check, naming the call.
std::vector<CaseResult> check_structured(const BackendModel& model, const Tokenizer& tok,
                                         const GoldenCase& g, const Profile& profile,
                                         const StructuredOptions& opt);

}  // namespace touchstone
