// http_grammar.h - grammars on a completion server (llama-server's `grammar`
// and `json_schema` fields), for the http:// backend.
//
// A server applies a grammar from the start of each generation, so it cannot
// be asked "the constrained pick after these tokens" directly. ServerGrammar
// asks it for its own constrained greedy continuation of the prompt that
// preceded set_grammar (one request, lengthened on demand, cached per prompt
// and grammar), and answers grammar_greedy from it: the pick at a position is
// the continuation's next token while the tokens appended since set_grammar
// are the continuation's own. After a token the server did not generate
// itself the pick is not available (TS_ERR_UNSUPPORTED). Allowed sets are
// never available (grammar_mask: TS_ERR_UNSUPPORTED).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "touchstone/abi/backend_abi.h"

namespace touchstone::http {

// The request member carrying a grammar: {"grammar": GBNF text} or
// {"json_schema": the schema object}.
struct GrammarField {
  std::string name;
  nlohmann::ordered_json value;  // ordered: a schema's property order is its meaning
};

// The field for `g`. Throws BackendError: TS_ERR_UNSUPPORTED for a regex (the
// server takes none), TS_ERR_INVALID_ARGUMENT for a NULL text, an unknown kind
// or a schema that is not a JSON object (naming the byte offset).
GrammarField grammar_field(const ts_grammar& g);

// The server's constrained greedy continuation of a prompt: its tokens (a stop
// token last when it stopped on one) and whether it ended (a stop token, or the
// grammar complete) rather than at the n_predict limit.
struct Continuation {
  std::vector<int32_t> tokens;
  bool ended = false;
};
using Generate = std::function<Continuation(std::span<const int32_t> prompt,
                                            const GrammarField& grammar, int32_t n_predict)>;

class ServerGrammar {
 public:
  // The picks for the last out.size() positions of `tokens` (the session's
  // sequence), the grammar set when the sequence held `start` tokens; at most
  // `max_new` tokens are ever generated after `start`. out[i] = -1 after a stop
  // token or before `start`. Throws BackendError TS_ERR_UNSUPPORTED naming the
  // step where `tokens` leaves the server's continuation.
  void picks(std::span<const int32_t> tokens, int32_t start, const GrammarField& grammar,
             int32_t max_new, const Generate& generate, std::span<int32_t> out);

 private:
  const Continuation& continuation(std::span<const int32_t> prompt, const GrammarField& grammar,
                                   int32_t need, int32_t max_new, const Generate& generate);
  std::map<std::string, Continuation> cache_;  // key: the prompt's ids, then the field
};

}  // namespace touchstone::http
