// structured.cpp - who applies a case's grammar, and the structured checks on
// one sequence (touchstone/harness/structured.h); the ones that need drafts or
// a batch are in structured_serving.cpp.
#include "touchstone/harness/structured.h"

#include <algorithm>
#include <functional>

#include "structured_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone {

ts_grammar_kind abi_grammar_kind(std::string_view kind) {
  switch (grammar::parse_grammar_kind(kind)) {
    case grammar::GrammarKind::json_schema:
      return TS_GRAMMAR_JSON_SCHEMA;
    case grammar::GrammarKind::regex:
      return TS_GRAMMAR_REGEX;
    case grammar::GrammarKind::gbnf:
      break;
  }
  return TS_GRAMMAR_GBNF;
}

std::string enforce_grammar(BackendSession& session, const GoldenCase& g) {
  if (!session.grammar_enforced()) return kGrammarByHarness;
  try {
    session.set_grammar(abi_grammar_kind(g.grammar_kind), g.grammar_text);
  } catch (const BackendError& e) {
    // A kind the backend does not take (llama.cpp's sampler reads GBNF only):
    // the harness applies that grammar, and the report says so.
    if (e.status() != TS_ERR_UNSUPPORTED) throw;
    return kGrammarByHarness;
  }
  return kGrammarByBackend;
}

const std::vector<std::string>& structured_check_names() {
  static const std::vector<std::string> names = {
      "structured.mask_parity",      "structured.constrained_greedy", "structured.termination",
      "structured.non_interference", "structured.rollback",           "structured.speculative",
      "structured.batch_isolation"};
  return names;
}

namespace structured {
namespace {

// mask_parity and constrained_greedy: the per-case parity walk (check_case),
// its structured findings split into the two rows.
std::vector<CaseResult> golden_walk(const BackendModel& model, const Tokenizer& tok,
                                    const GoldenCase& g, const Profile& p,
                                    const StructuredOptions& o, bool backend) {
  BackendSession session(model, o.session);
  const CaseResult c = check_case(session, tok, g, p, o.max_steps);
  CaseResult masks = row("structured.mask_parity", backend);
  CaseResult greedy = row("structured.constrained_greedy", backend);
  for (CaseResult* r : {&masks, &greedy}) r->n_steps = r->n_total = c.n_steps;
  for (const std::string& f : c.failures) {
    if (f.starts_with("structured.mask_parity")) {
      masks.failures.push_back(f);
    } else if (f.starts_with("structured.constrained_greedy")) {
      greedy.failures.push_back(f);
    } else if (f.starts_with("greedy diverges") || f.starts_with("top-1 agreement") ||
               f.find("no greedy token") != f.npos) {
      greedy.failures.push_back("structured.constrained_greedy: " + f);
    } else if (f == c.backend_error) {
      for (CaseResult* r : {&masks, &greedy}) r->failures.push_back(f), r->backend_error = f;
    }
  }
  for (const Violation& v : c.violations) {
    if (v.check == "mask_difference") masks.violations.push_back(v);
    if (v.check == "greedy" || v.check == "top1_agreement") greedy.violations.push_back(v);
  }
  if (std::find(c.not_supported.begin(), c.not_supported.end(), kMaskParityNotExposed) !=
      c.not_supported.end()) {
    masks = row("structured.mask_parity", backend);
    masks.not_supported.push_back(kMaskParityNotExposed);
  }
  masks.first_logit_violation_step = c.first_mask_difference_step;
  greedy.first_divergence = c.first_divergence;
  greedy.near_ties = c.near_ties;
  greedy.first_logit_violation_step = c.first_unaccepted_flip_step;
  greedy.n_matched = c.n_matched;
  // A failure without a step of its own (top-1 agreement): the first flip's.
  if (!greedy.failures.empty() && greedy.first_logit_violation_step < 0 && c.first_divergence)
    greedy.first_logit_violation_step = c.first_divergence->step;
  for (CaseResult* r : {&masks, &greedy})
    if (!r->failures.empty() && r->first_logit_violation_step < 0)
      r->first_logit_violation_step = 0;
  return {masks, greedy};
}

// termination: along G, no stop token allowed where the grammar cannot end;
// after G's stop token, nothing allowed and nothing accepted.
void termination(Sequence& s, const Tokenizer& tok, const GoldenCase& g,
                 const grammar::GrammarVocab& vocab, int max_steps, CaseResult& r, const Profile&,
                 bool) {
  grammar::GrammarOracle t = truth(vocab, g);
  const int n = std::min<int>(max_steps, int(g.greedy_ids.size()));
  for (int i = 0; i < n; ++i) {
    r.n_steps = i + 1;
    const std::vector<uint32_t> m = s.mask();
    for (int32_t stop : vocab.stop_tokens()) {
      if (grammar::mask_allows(m, stop) && !t.can_terminate()) {
        fail(r, i,
             fmt::format("stop token {} allowed where the grammar cannot end (after {:?})",
                         token_text(tok, stop),
                         tok.decode(std::span<const int32_t>(g.greedy_ids.data(), size_t(i)))));
        return;
      }
    }
    const int32_t token = g.greedy_ids[size_t(i)];
    if (!t.accept(token)) return;  // mask_parity's finding, not this check's
    s.append(token);
    if (!vocab.is_stop(token)) continue;
    if (const size_t k = grammar::mask_count(s.mask()); k != 0)
      fail(r, i + 1, fmt::format("{} tokens allowed after the stop token", k));
    if (!s.by_backend()) return;
    try {  // a token after the stop must be refused
      std::vector<float> after(size_t(g.n_vocab));
      s.session().decode(token, after);
      fail(r, i + 1, "the backend accepted a token after the stop token");
    } catch (const BackendError& e) {
      if (e.status() != TS_ERR_INVALID_ARGUMENT) throw;
    }
    return;
  }
}

// non_interference: along the sequence's own picks, where the row's
// unconstrained argmax is a token the grammar allows, the pick is that token, or
// (outside the exact tier) a token within the profile's near-tie margin of it in that
// row: a backend that enforces the grammar itself (llama-server) gives the
// constrained pick from another request than the unconstrained row, whose logits may
// differ by rounding (docs/structured-output.md).
void non_interference(Sequence& s, const Tokenizer& tok, const GoldenCase& g,
                      const grammar::GrammarVocab& vocab, int max_steps, CaseResult& r,
                      const Profile& p, bool exact) {
  grammar::GrammarOracle t = truth(vocab, g);
  for (int i = 0; i < max_steps; ++i) {
    r.n_steps = i + 1;
    const int32_t u = metrics::argmax(s.row());
    const int32_t c = s.pick();
    if (u >= 0 && grammar::mask_allows(t.allowed_mask(), u) && c != u &&
        !part_or_fail(r, tok, p, exact, i, s.row(), u, c,
                      fmt::format("the unconstrained argmax {} conforms, the constrained pick",
                                  token_text(tok, u)))) {
      return;
    }
    if (c < 0 || vocab.is_stop(c)) return;
    if (!t.accept(c)) {
      fail(r, i, fmt::format("picked {}, which the grammar refuses", token_text(tok, c)));
      return;
    }
    if (i + 1 < max_steps) s.append(c);
  }
}

// rollback: the allowed sets along G; then rewinds (to the middle, to 1, to 0)
// and a fork at the middle must give the set first seen at their position.
void rollback(Sequence& s, const Tokenizer& tok, const GoldenCase& g,
              const grammar::GrammarVocab& vocab, int max_steps, CaseResult& r, const Profile&,
              bool) {
  std::vector<std::vector<uint32_t>> seen;
  int n = 0;
  for (; n < max_steps && n < int(g.greedy_ids.size()); ++n) {
    const int32_t token = g.greedy_ids[size_t(n)];
    if (vocab.is_stop(token)) break;
    seen.push_back(s.mask());
    s.append(token);
  }
  seen.push_back(s.mask());
  r.n_steps = n;
  auto same = [&](std::vector<uint32_t> got, int at, const std::string& how) {
    if (got == seen[size_t(at)]) return true;
    fail(r, at,
         fmt::format("{}: {}", how, mask_difference(tok, got, seen[size_t(at)], "now", "first")));
    return false;
  };
  const int mid = n / 2;
  {
    std::unique_ptr<Sequence> f = s.fork(mid);
    if (!same(f->mask(), mid, fmt::format("in a fork at step {} of {}", mid, n))) return;
  }
  for (int to : {mid, std::min(1, n), 0}) {
    s.rewind(to);
    if (!same(s.mask(), to, fmt::format("after rewind to step {} from {}", to, n))) return;
    for (int i = to; i < n; ++i) s.append(g.greedy_ids[size_t(i)]);
    if (!same(s.mask(), n, fmt::format("replayed from step {}", to))) return;
  }
}

// Runs one check, a failing backend call failing it (naming the call).
void guarded(CaseResult& r, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    r.backend_error = e.what();
    fail(r, std::max(r.n_steps - 1, 0), fmt::format("backend call failed: {}", e.what()));
  }
}

}  // namespace
}  // namespace structured

std::vector<CaseResult> check_structured(const BackendModel& model, const Tokenizer& tok,
                                         const GoldenCase& g, const Profile& profile,
                                         const StructuredOptions& opt) {
  using namespace structured;
  if (!g.has_grammar()) throw Error("structured checks: case '{}' has no grammar", g.name);
  const auto wanted = [&](const std::string& c) {
    return opt.checks.empty() ||
           std::find(opt.checks.begin(), opt.checks.end(), c) != opt.checks.end();
  };
  const grammar::GrammarVocab vocab(tok);
  // Who applies the grammar: the backend, if it enforces grammars and takes this kind.
  bool backend = false, backend_masks = false;
  {
    BackendSession probe(model, opt.session);
    backend = enforce_grammar(probe, g) == kGrammarByBackend;
    backend_masks = backend && probe.exposed_grammar_mask().has_value();
  }
  const ts_capabilities caps = model.library()->capabilities();
  const bool exact = (caps.flags & TS_CAP_BATCH_INVARIANT) &&
                     (caps.batch_invariant_paths == 0 ||
                      (caps.batch_invariant_paths >> opt.session.weight_path) & 1u);
  StructuredOptions o = opt;
  o.by_backend = backend;
  o.backend_masks = backend_masks;
  std::vector<CaseResult> out;
  if (wanted("structured.mask_parity") || wanted("structured.constrained_greedy")) {
    for (CaseResult& r : golden_walk(model, tok, g, profile, opt, backend))
      if (wanted(r.name)) out.push_back(std::move(r));
  }
  using Walk = void (*)(Sequence&, const Tokenizer&, const GoldenCase&,
                        const grammar::GrammarVocab&, int, CaseResult&, const Profile&, bool);
  struct Named {
    const char* name;
    Walk walk;
    bool needs_masks;
  };
  const Named walks[] = {{"structured.termination", termination, true},
                         {"structured.non_interference", non_interference, false},
                         {"structured.rollback", rollback, true}};
  for (const auto& [name, walk, needs_masks] : walks) {
    if (!wanted(name)) continue;
    CaseResult r = row(name, backend);
    if (needs_masks && backend && !backend_masks) {
      r.not_supported.push_back(
          fmt::format("{} (the backend enforces the grammar without "
                      "exposing its allowed sets)",
                      name));
      out.push_back(std::move(r));
      continue;
    }
    guarded(r, [&] {
      Sequence s(model, opt.session, g, vocab);
      walk(s, tok, g, vocab, opt.max_steps, r, profile, exact);
    });
    out.push_back(std::move(r));
  }
  if (wanted("structured.speculative"))
    out.push_back(check_speculative(model, tok, g, profile, o, vocab, exact));
  if (wanted("structured.batch_isolation"))
    out.push_back(check_batch_isolation(model, tok, g, profile, o, vocab, exact));
  for (CaseResult& r : out) {
    r.n_total = std::max(r.n_total, r.n_steps);
    r.passed = r.failures.empty();
    // Steps compared before the first failure.
    if (r.n_matched == 0)
      r.n_matched = r.passed ? r.n_steps : std::max(0, r.first_logit_violation_step);
  }
  return out;
}

}  // namespace touchstone
