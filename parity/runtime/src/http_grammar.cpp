// http_grammar.cpp - grammars on a completion server (http_grammar.h).
#include "http_grammar.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "touchstone/runtime/backend_channel.h"

namespace touchstone::http {

GrammarField grammar_field(const ts_grammar& g) {
  if (g.text == nullptr)
    throw BackendError(TS_ERR_INVALID_ARGUMENT, "http: a grammar without text");
  switch (g.kind) {
    case TS_GRAMMAR_GBNF:
      return {"grammar", std::string(g.text)};
    case TS_GRAMMAR_JSON_SCHEMA: {
      try {
        nlohmann::ordered_json schema = nlohmann::ordered_json::parse(g.text);
        if (!schema.is_object()) {
          throw BackendError(TS_ERR_INVALID_ARGUMENT, "http: the JSON Schema is not a JSON object");
        }
        return {"json_schema", std::move(schema)};
      } catch (const nlohmann::ordered_json::parse_error& e) {
        throw BackendError(
            TS_ERR_INVALID_ARGUMENT,
            fmt::format("http: the JSON Schema is not JSON (byte {}: {})", e.byte, e.what()));
      }
    }
    case TS_GRAMMAR_REGEX:
      throw BackendError(TS_ERR_UNSUPPORTED,
                         "http: a completion server takes GBNF ('grammar') and JSON Schema "
                         "('json_schema'), not a regex");
  }
  throw BackendError(TS_ERR_INVALID_ARGUMENT,
                     fmt::format("http: unknown grammar kind {}", static_cast<int>(g.kind)));
}

const Continuation& ServerGrammar::continuation(std::span<const int32_t> prompt,
                                                const GrammarField& grammar, int32_t need,
                                                int32_t max_new, const Generate& generate) {
  const std::string key =
      fmt::format("{}|{}|{}", fmt::join(prompt, ","), grammar.name, grammar.value.dump());
  Continuation& c = cache_[key];
  if (c.ended || int32_t(c.tokens.size()) >= need) return c;
  const int32_t n_predict =
      std::min(max_new, std::max({need, 2 * int32_t(c.tokens.size()), int32_t{32}}));
  if (n_predict < need) {
    throw BackendError(TS_ERR_CONTEXT_FULL,
                       fmt::format("http: a pick {} tokens after set_grammar needs more than "
                                   "the server's context leaves ({} tokens)",
                                   need - 1, max_new));
  }
  c = generate(prompt, grammar, n_predict);
  // A continuation shorter than asked for ended (a stop token, or a stop the
  // server chose): asking again would give the same.
  c.ended = c.ended || int32_t(c.tokens.size()) < n_predict;
  return c;
}

void ServerGrammar::picks(std::span<const int32_t> tokens, int32_t start,
                          const GrammarField& grammar, int32_t max_new, const Generate& generate,
                          std::span<int32_t> out) {
  const auto L = int32_t(tokens.size()), n = int32_t(out.size());
  if (start < 0 || start > L) {
    throw BackendError(TS_ERR_INVALID_ARGUMENT,
                       fmt::format("http: grammar set at {} outside [0, {}]", start, L));
  }
  const std::span<const int32_t> prompt = tokens.first(size_t(start));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t j = (L - n + i) + 1 - start;  // continuation tokens before this pick
    if (j < 0) {
      out[size_t(i)] = -1;
      continue;
    }
    const Continuation& c = continuation(prompt, grammar, j + 1, max_new, generate);
    for (int32_t k = 0; k < j; ++k) {
      const int32_t want = k < int32_t(c.tokens.size()) ? c.tokens[size_t(k)] : -1;
      if (tokens[size_t(start + k)] == want) continue;
      throw BackendError(
          TS_ERR_UNSUPPORTED,
          fmt::format("http: step {} after set_grammar holds token {}, the server's own "
                      "constrained continuation {} (a server applies a grammar from the start of "
                      "a generation: its pick after a token it did not generate is not available)",
                      k, tokens[size_t(start + k)],
                      want < 0 ? "has ended" : fmt::format("{}", want)));
    }
    out[size_t(i)] = j < int32_t(c.tokens.size()) ? c.tokens[size_t(j)] : -1;
  }
}

}  // namespace touchstone::http
