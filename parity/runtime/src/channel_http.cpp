// channel_http.cpp - "http://HOST:PORT": a llama.cpp llama-server (native
// /completion API) as a backend. Each prefill / decode is one POST with the
// whole token sequence so far, n_predict 1, temperature 0, n_probs = top_n;
// rewind truncates the client-side token list. The server's prompt cache:
// a session's first request asks for none (cache_prompt false: its prompt is
// computed from scratch, a cache miss); every later request of the session, and
// every request of a forked session, reuses what a slot holds (cache_prompt
// true: a hit on the common prefix). step_batch sends its entries as concurrent
// requests (a server with parallel slots batches them); fork_session copies the
// client-side prefix. Rows are ABI v5 top-N rows: natural-log probabilities of
// the returned tokens, -INFINITY elsewhere (TS_CAP_TOP_N_LOGPROBS). Every
// failure -- transport, time-out, HTTP status, malformed JSON, an answer for a
// prompt of another length, a model other than the manifest's -- throws
// BackendError / BackendCrash naming the URL, the request number and what was wrong.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "http_client.h"
#include "http_grammar.h"
#include "touchstone/runtime/backend_channel.h"

namespace touchstone {
namespace {

using nlohmann::json;

std::string excerpt(const std::string& s) {
  constexpr size_t kMax = 160;
  std::string e = s.substr(0, kMax);
  for (char& c : e)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '.';
  return s.size() > kMax ? e + "..." : e;
}

// The answer as JSON: HTTP 200 with a parsable object, or a BackendError
// naming the URL, the request number and what was wrong.
json answer_json(const http::Response& r) {
  const std::string where = fmt::format("{} request #{}", r.url, r.number);
  if (r.status != 200) {
    throw BackendError(TS_ERR_INTERNAL,
                       fmt::format("{}: HTTP {}: {}", where, r.status, excerpt(r.body)));
  }
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw BackendError(TS_ERR_INTERNAL, fmt::format("{}: malformed JSON answer ({} bytes: {})",
                                                    where, r.body.size(), excerpt(r.body)));
  }
  return j;
}

[[noreturn]] void malformed(const http::Response& r, const std::string& what) {
  throw BackendError(TS_ERR_INTERNAL, fmt::format("{} request #{}: malformed answer: {} ({})",
                                                  r.url, r.number, what, excerpt(r.body)));
}

// Integer member `key` of object `o`, or malformed().
int64_t int_member(const http::Response& r, const json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) malformed(r, fmt::format("no integer '{}'", key));
  return it->get<int64_t>();
}

// String member `key` of object `o`: `fallback` when absent, else malformed().
std::string string_member(const http::Response& r, const json& o, const char* key,
                          const char* fallback) {
  const auto it = o.find(key);
  if (it == o.end()) return fallback;
  if (!it->is_string()) malformed(r, fmt::format("'{}' is not a string", key));
  return it->get<std::string>();
}

class HttpChannel final : public BackendChannel {
 public:
  HttpChannel(const std::string& url, const HttpOptions& o)
      : client_(url, {o.connect_timeout_s, o.call_timeout_s, o.max_requests}), top_n_(o.top_n) {
    info_.api_version = TS_BACKEND_API_VERSION;
    info_.name = "http";
    info_.path = url;
    const http::Response r = client_.get("/props");
    const json props = answer_json(r);
    model_path_ = string_member(r, props, "model_path", "");
    info_.version = string_member(r, props, "build_info", "unknown");
    info_.device = fmt::format("llama-server at {} serving {}", url,
                               model_path_.empty() ? "(model_path not given)" : model_path_);
    info_.step_batch = true;  // concurrent requests
    info_.fork = true;        // the client-side prefix; the server's prompt cache reuses it
    info_.grammar = true;     // 'grammar' / 'json_schema' (http_grammar.h)
  }

  const BackendInfo& info() const override { return info_; }

  ts_capabilities capabilities() override {
    ts_capabilities c{};
    c.struct_size = sizeof(c);
    c.flags = TS_CAP_TOP_N_LOGPROBS | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY |
              TS_CAP_STRUCTURED_OUTPUT;
    c.top_n = top_n_;
    c.max_context = n_ctx_;
    c.determinism_note = "a remote server: the harness cannot see how it computes";
    return c;
  }

  Handle load_model(const std::string& gguf_path, int32_t* n_vocab) override;
  void free_model(Handle) noexcept override {}
  Handle open_session(Handle model, const ts_session_options& options) override;
  void free_session(Handle session) noexcept override { sessions_.erase(session); }
  void step_batch(std::span<const BatchCall> entries) override;
  Handle fork_session(Handle src, int32_t n_prefix) override;

  void prefill(Handle session, std::span<const int32_t> tokens, bool all_positions,
               std::span<float> out) override {
    if (all_positions) {
      throw BackendError(TS_ERR_UNSUPPORTED,
                         "http: all-position logits are not available from a completion server");
    }
    const BatchCall call{session, tokens, false, out};
    step_batch({&call, 1});
  }
  void decode(Handle session, int32_t token, std::span<float> out) override {
    const BatchCall call{session, {&token, 1}, false, out};
    step_batch({&call, 1});
  }
  int32_t prefill_greedy(Handle, std::span<const int32_t>) override {
    throw BackendError(TS_ERR_UNSUPPORTED, "http: no prefill_greedy");
  }
  void rewind(Handle session, int32_t position) override {
    std::vector<int32_t>& seq = of(session).tokens;
    if (position < 0 || size_t(position) > seq.size()) {
      throw BackendError(TS_ERR_INVALID_ARGUMENT,
                         fmt::format("http: rewind to {} outside [0, {}]", position, seq.size()));
    }
    seq.resize(size_t(position));
    if (position < of(session).grammar_at) of(session).grammar.reset();  // rewound past it
  }
  int32_t position(Handle session) override { return int32_t(of(session).tokens.size()); }
  void set_taps(Handle, bool) override { throw Error("http: no layer taps"); }
  void read_taps(Handle, std::span<float>) override { throw Error("http: no layer taps"); }
  std::optional<std::vector<int32_t>> tokenize(const std::string& text) override;
  void set_grammar(Handle session, const ts_grammar* grammar) override {
    Seq& seq = of(session);
    if (grammar == nullptr) return seq.grammar.reset();
    if (grammar->struct_size < sizeof(ts_grammar))
      throw BackendError(TS_ERR_INVALID_ARGUMENT, "http: ts_grammar.struct_size too small");
    seq.grammar = http::grammar_field(*grammar);
    seq.grammar_at = int32_t(seq.tokens.size());
  }
  void grammar_mask(Handle, std::span<uint32_t>) override {
    throw BackendError(TS_ERR_UNSUPPORTED,
                       "http: a completion server does not expose its allowed sets");
  }
  void grammar_greedy(Handle session, std::span<int32_t> out) override;

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    bool fresh = true;  // no request yet: the next one asks for no cache reuse
    std::optional<http::GrammarField> grammar;
    int32_t grammar_at = 0;  // tokens held when the grammar was set
  };
  Seq& of(Handle session) {
    const auto it = sessions_.find(session);
    if (it == sessions_.end()) throw Error("http: unknown session {}", session);
    return it->second;
  }
  std::string request_body(const Seq& seq) const;
  void check_room(const Seq& seq) const;
  std::vector<int32_t> tokenize_text(const std::string& text, bool special);
  void fill_row(const http::Response& r, const json& j, std::span<float> out) const;
  http::Continuation generate(std::span<const int32_t> prompt, const http::GrammarField& grammar,
                              int32_t n_predict);

  http::Client client_;
  BackendInfo info_;
  int32_t top_n_ = 0, n_vocab_ = 0, n_ctx_ = 0, ascii_token_ = 0;
  std::string model_path_;
  std::map<Handle, Seq> sessions_;
  Handle next_session_ = 1;
  http::ServerGrammar server_grammar_;
};

Handle HttpChannel::load_model(const std::string& gguf_path, int32_t* n_vocab) {
  answer_json(client_.get("/health"));
  const http::Response models = client_.get("/v1/models");
  const json m = answer_json(models);
  if (!m.contains("data") || !m["data"].is_array() || m["data"].empty() ||
      !m["data"][0].is_object() || !m["data"][0].contains("meta")) {
    malformed(models, "no data[0].meta (n_vocab, n_ctx)");
  }
  const json& meta = m["data"][0]["meta"];
  n_vocab_ = int32_t(int_member(models, meta, "n_vocab"));
  n_ctx_ = int32_t(int_member(models, meta, "n_ctx"));
  // The same GGUF as the manifest's: the file name must match (the vocabulary,
  // and the tokenization of a prompt, are checked by the harness).
  const std::string want = std::filesystem::path(gguf_path).filename().string();
  const std::string got = std::filesystem::path(model_path_).filename().string();
  if (got != want) {
    throw BackendError(TS_ERR_INTERNAL,
                       fmt::format("{}: the server serves '{}', the manifest names '{}' (start "
                                   "llama-server with -m .../{})",
                                   client_.base_url(), model_path_, want, want));
  }
  // llama-server withholds the probabilities of a sampled token that ends
  // inside a UTF-8 character (an emoji's first byte): the request forces the
  // sampled token to this plain ASCII one with logit_bias. The probabilities
  // come from the raw logits, before any sampler, so the bias leaves them as
  // they are (docs/backends/http.md).
  const std::vector<int32_t> a = tokenize_text("a", false);
  if (a.size() != 1 || a[0] < 0 || a[0] >= n_vocab_) {
    throw BackendError(TS_ERR_INTERNAL, fmt::format("{}/tokenize: \"a\" is {} tokens, expected one",
                                                    client_.base_url(), a.size()));
  }
  ascii_token_ = a[0];
  *n_vocab = n_vocab_;
  return 1;
}

Handle HttpChannel::open_session(Handle, const ts_session_options& o) {
  if (o.fault) throw BackendError(TS_ERR_UNSUPPORTED, "http: no fault injection");
  // o.max_context is what the whole run might need; each request is checked
  // against the server's context instead (step()).
  sessions_[next_session_] = {};
  return next_session_++;
}

Handle HttpChannel::fork_session(Handle src, int32_t n_prefix) {
  const Seq& from = of(src);
  if (n_prefix < 0 || size_t(n_prefix) > from.tokens.size()) {
    throw BackendError(TS_ERR_INVALID_ARGUMENT,
                       fmt::format("http: fork of {} tokens from a session holding {}", n_prefix,
                                   from.tokens.size()));
  }
  Seq fork{{from.tokens.begin(), from.tokens.begin() + n_prefix}, false, {}, 0};
  if (from.grammar && n_prefix >= from.grammar_at) {
    fork.grammar = from.grammar;
    fork.grammar_at = from.grammar_at;
  }
  sessions_[next_session_] = std::move(fork);
  return next_session_++;
}

void HttpChannel::check_room(const Seq& seq) const {
  if (n_ctx_ > 0 && seq.tokens.size() + 1 > size_t(n_ctx_)) {
    throw BackendError(TS_ERR_CONTEXT_FULL,
                       fmt::format("{}: the server's context is {} tokens, this step needs {} "
                                   "(start llama-server with a larger -c)",
                                   client_.base_url(), n_ctx_, seq.tokens.size() + 1));
  }
}

std::string HttpChannel::request_body(const Seq& seq) const {
  const json req{{"prompt", seq.tokens},
                 {"n_predict", 1},
                 {"temperature", 0.0},
                 {"n_probs", top_n_},
                 {"cache_prompt", !seq.fresh},
                 {"post_sampling_probs", false},
                 {"logit_bias", json::array({json::array({ascii_token_, 1000.0})})},
                 {"stream", false}};
  return req.dump();
}

// One request per entry, all at once; every answer must be for a prompt of
// its request's length (a server that mixes up concurrent answers fails here).
void HttpChannel::step_batch(std::span<const BatchCall> entries) {
  std::vector<std::string> bodies;
  for (const BatchCall& e : entries) {
    if (e.all_positions) {
      throw BackendError(TS_ERR_UNSUPPORTED,
                         "http: all-position logits are not available from a completion server");
    }
    if (e.tokens.empty()) throw BackendError(TS_ERR_INVALID_ARGUMENT, "http: a step of 0 tokens");
    Seq& seq = of(e.session);
    seq.tokens.insert(seq.tokens.end(), e.tokens.begin(), e.tokens.end());
    check_room(seq);
    bodies.push_back(request_body(seq));
    seq.fresh = false;
  }
  const std::vector<http::Response> answers =
      bodies.size() == 1 ? std::vector<http::Response>{client_.post_json("/completion", bodies[0])}
                         : client_.post_json_concurrent("/completion", bodies);
  for (size_t i = 0; i < entries.size(); ++i) {
    const http::Response& r = answers[i];
    const json j = answer_json(r);
    if (j.value("truncated", false)) malformed(r, "the server truncated the prompt");
    const size_t n = of(entries[i].session).tokens.size();
    if (const auto ev = j.find("tokens_evaluated");
        ev != j.end() && ev->is_number_integer() && ev->get<int64_t>() != int64_t(n)) {
      malformed(r, fmt::format("an answer for a prompt of {} tokens, the request sent {} (one of "
                               "{} concurrent requests: answers mixed up?)",
                               ev->get<int64_t>(), n, entries.size()));
    }
    fill_row(r, j, entries[i].out);
  }
}

void HttpChannel::fill_row(const http::Response& r, const json& j, std::span<float> out) const {
  const auto cp = j.find("completion_probabilities");
  if (cp == j.end() || !cp->is_array() || cp->empty() || !(*cp)[0].is_object())
    malformed(r, "no completion_probabilities[0] (was n_probs honoured?)");
  const auto top = (*cp)[0].find("top_logprobs");
  if (top == (*cp)[0].end() || !top->is_array() || top->empty())
    malformed(r, "no completion_probabilities[0].top_logprobs");
  if (out.size() != size_t(n_vocab_))
    throw Error("http: logits buffer holds {} floats, n_vocab is {}", out.size(), n_vocab_);
  std::fill(out.begin(), out.end(), -INFINITY);
  for (const json& e : *top) {
    if (!e.is_object()) malformed(r, "a top_logprobs entry is not an object");
    const int64_t id = int_member(r, e, "id");
    const auto lp = e.find("logprob");
    if (id < 0 || id >= n_vocab_)
      malformed(r, fmt::format("token id {} outside the vocabulary", id));
    if (lp == e.end() || !(lp->is_number() || lp->is_null()))
      malformed(r, fmt::format("token {}: no numeric logprob", id));
    const double v = lp->is_null() ? -INFINITY : lp->get<double>();
    if (std::isnan(v) || v > 1e-3) malformed(r, fmt::format("token {}: logprob {} > 0", id, v));
    if (out[size_t(id)] != -INFINITY) malformed(r, fmt::format("token {} listed twice", id));
    out[size_t(id)] = float(std::min(v, 0.0));
  }
}

void HttpChannel::grammar_greedy(Handle session, std::span<int32_t> out) {
  const Seq& seq = of(session);
  if (!seq.grammar)
    throw BackendError(TS_ERR_INVALID_ARGUMENT, "http: grammar_greedy without a grammar");
  const int32_t max_new = n_ctx_ > 0 ? n_ctx_ - seq.grammar_at : 4096;
  const http::Generate generate = [this](std::span<const int32_t> prompt,
                                         const http::GrammarField& g, int32_t n_predict) {
    return this->generate(prompt, g, n_predict);
  };
  server_grammar_.picks(seq.tokens, seq.grammar_at, *seq.grammar, max_new, generate, out);
}

// The server's own constrained greedy continuation (temperature 0 under the
// grammar): 'tokens' (return_tokens) holds every generated id, the stop token
// included; stop_type "limit" means it stopped at n_predict.
http::Continuation HttpChannel::generate(std::span<const int32_t> prompt,
                                         const http::GrammarField& grammar, int32_t n_predict) {
  const nlohmann::ordered_json req{{"prompt", prompt},           {"n_predict", n_predict},
                                   {"temperature", 0.0},         {"cache_prompt", true},
                                   {"return_tokens", true},      {"stream", false},
                                   {grammar.name, grammar.value}};
  const http::Response r = client_.post_json("/completion", req.dump());
  const json j = answer_json(r);
  if (j.value("truncated", false)) malformed(r, "the server truncated the prompt");
  const auto t = j.find("tokens");
  if (t == j.end() || !t->is_array())
    malformed(r, "no 'tokens' array (was return_tokens honoured?)");
  http::Continuation c;
  for (const json& v : *t) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab_)
      malformed(r, fmt::format("generated token {} is not a token id", v.dump()));
    c.tokens.push_back(v.get<int32_t>());
  }
  c.ended = string_member(r, j, "stop_type", "limit") != "limit";
  return c;
}

std::optional<std::vector<int32_t>> HttpChannel::tokenize(const std::string& text) {
  return tokenize_text(text, true);
}

std::vector<int32_t> HttpChannel::tokenize_text(const std::string& text, bool special) {
  const json req{{"content", text}, {"add_special", special}, {"parse_special", special}};
  const http::Response r = client_.post_json("/tokenize", req.dump());
  const json j = answer_json(r);
  const auto t = j.find("tokens");
  if (t == j.end() || !t->is_array()) malformed(r, "no 'tokens' array");
  std::vector<int32_t> ids;
  for (const json& v : *t) {
    if (!v.is_number_integer()) malformed(r, "a token is not an integer");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

}  // namespace

std::string http_base_url(std::string_view spec) {
  std::string url(spec);
  while (url.ends_with('/')) url.pop_back();
  const size_t host = url.find("://") + 3;
  if (url.size() <= host || url.find('/', host) != std::string::npos) {
    throw Error("backend '{}': expected http://HOST:PORT (the server's root, no path)", spec);
  }
  return url;
}

std::unique_ptr<BackendChannel> open_http(const std::string& spec, const HttpOptions& options) {
  if (options.top_n < 1) throw Error("http: top_n must be >= 1, not {}", options.top_n);
  return std::make_unique<HttpChannel>(http_base_url(spec), options);
}

}  // namespace touchstone
