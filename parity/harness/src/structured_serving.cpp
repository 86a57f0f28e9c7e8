// structured_serving.cpp - the structured checks that serve: speculative
// drafts under a grammar, and a constrained sequence batched with an
// unconstrained one (touchstone/harness/structured.h).
#include <algorithm>
#include <cmath>

#include "structured_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone::structured {
namespace {

// The wrong draft of a round: the allowed token other than `right` that scores
// highest in `row` (a plausible draft model's mistake); -1 when there is none.
int32_t wrong_draft(std::span<const float> row, std::span<const uint32_t> allowed, int32_t right) {
  std::vector<float> masked(row.begin(), row.end());
  grammar::apply_mask(allowed, masked);
  if (right >= 0) masked[size_t(right)] = -INFINITY;
  const int32_t t = metrics::argmax(masked);
  return t >= 0 && std::isfinite(masked[size_t(t)]) ? t : -1;
}

// One round's drafts at step c of the plain run: the pending pick, then the
// plain tokens up to a wrong one at offset w (1 <= w < K); they end at a stop.
std::vector<int32_t> drafts_at(const PlainRun& plain, const grammar::GrammarVocab& vocab, size_t c,
                               int32_t pending, int K, int round) {
  std::vector<int32_t> d{pending};
  const size_t w = 1 + size_t(round % std::max(K - 1, 1));
  for (size_t j = 1; j <= w && c + j < plain.tokens.size(); ++j) {
    if (vocab.is_stop(d.back()) || d.back() != plain.tokens[c + j - 1]) break;
    const int32_t right = plain.tokens[c + j];
    if (right < 0) break;  // nothing was allowed there: no draft
    const int32_t wrong = j == w ? wrong_draft(plain.rows[c + j], plain.masks[c + j], right) : -1;
    d.push_back(wrong >= 0 ? wrong : right);
  }
  return d;
}

// Verifies `d` in one all-position prefill, accepts the agreeing prefix and
// rewinds the rest; returns the tokens accepted and the next pending pick.
std::pair<size_t, int32_t> verify_round(Sequence& s, std::span<const int32_t> d) {
  const int32_t base = s.steps();
  const std::vector<float> rows = s.verify(d);
  const std::vector<int32_t> p = s.picks(int32_t(d.size()), d, rows);
  size_t n = 1;
  while (n < d.size() && p[n - 1] == d[n]) ++n;
  if (n < d.size()) {
    s.rewind(base + int32_t(n));
    const size_t V = rows.size() / d.size();
    s.set_row(std::span<const float>(rows).subspan((n - 1) * V, V));
  }
  return {n, p[n - 1]};
}

// The unconstrained sequence alone: its own greedy tokens and rows.
PlainRun unconstrained_run(const BackendModel& model, const StructuredOptions& o,
                           const GoldenCase& g) {
  PlainRun run;
  BackendSession s(model, o.session);
  run.rows.push_back(s.prefill(g.prompt_ids));
  for (int i = 0; i < o.max_steps; ++i) {
    run.tokens.push_back(metrics::argmax(run.rows.back()));
    if (i + 1 == o.max_steps || run.tokens.back() < 0) break;
    run.rows.emplace_back(size_t(g.n_vocab));
    s.decode(run.tokens.back(), run.rows.back());
  }
  return run;
}

}  // namespace

CaseResult check_speculative(const BackendModel& model, const Tokenizer& tok, const GoldenCase& g,
                             const Profile& p, const StructuredOptions& o,
                             const grammar::GrammarVocab& vocab, bool exact) {
  CaseResult r = row("structured.speculative", o.by_backend);
  if (!(model.library()->capabilities().flags & TS_CAP_ALL_POSITION_LOGITS)) {
    r.not_supported.push_back("structured.speculative (no TS_CAP_ALL_POSITION_LOGITS)");
    return r;
  }
  if (o.by_backend && !o.backend_masks) {
    r.not_supported.push_back(
        "structured.speculative (the backend enforces the grammar without exposing its allowed "
        "sets, which the drafts and the rewound state are judged by)");
    return r;
  }
  try {
    const PlainRun plain = [&] {
      Sequence plain_seq(model, o.session, g, vocab);
      return plain_run(plain_seq, vocab, o.max_steps);
    }();
    Sequence s(model, o.session, g, vocab);
    int32_t pending = s.pick();
    size_t c = 0;
    for (int round = 0; c < plain.tokens.size(); ++round) {
      r.n_steps = int(c) + 1;
      if (pending != plain.tokens[c]) {
        part_or_fail(r, tok, p, exact, int(c), plain.rows[c], plain.tokens[c], pending,
                     fmt::format("round {}: the pick after the accepted drafts", round));
        break;
      }
      if (s.mask() != plain.masks[c]) {
        fail(r, int(c),
             fmt::format("round {}: after the rejected drafts were rewound: {}", round,
                         mask_difference(tok, s.mask(), plain.masks[c], "now", "without drafts")));
        break;
      }
      if (pending < 0 || vocab.is_stop(pending) || c + 1 == plain.tokens.size()) break;
      const std::vector<int32_t> d = drafts_at(plain, vocab, c, pending, o.draft_length, round);
      const auto [n, next] = verify_round(s, d);
      // Accepted drafts past the first are the backend's picks too: each must be
      // the plain run's token (a near tie parts the two sequences here).
      for (size_t j = 1; j < n; ++j) {
        if (d[j] == plain.tokens[c + j]) continue;
        part_or_fail(r, tok, p, exact, int(c + j), plain.rows[c + j], plain.tokens[c + j], d[j],
                     fmt::format("round {}: accepted draft {}", round, j));
        return r;
      }
      c += n;
      pending = next;
    }
  } catch (const std::exception& e) {
    r.backend_error = e.what();
    fail(r, std::max(r.n_steps - 1, 0), fmt::format("backend call failed: {}", e.what()));
  }
  return r;
}

CaseResult check_batch_isolation(const BackendModel& model, const Tokenizer& tok,
                                 const GoldenCase& g, const Profile& p, const StructuredOptions& o,
                                 const grammar::GrammarVocab& vocab, bool exact) {
  CaseResult r = row("structured.batch_isolation", o.by_backend);
  try {
    Sequence alone(model, o.session, g, vocab);
    const PlainRun constrained = plain_run(alone, vocab, o.max_steps);
    const PlainRun free = unconstrained_run(model, o, g);
    const std::vector<int32_t>& free_tokens = free.tokens;
    const std::vector<std::vector<float>>& free_rows = free.rows;
    // Both in one step_batch per step: the prompts, then one token each.
    auto a_session = std::make_unique<BackendSession>(model, o.session);
    BackendSession b(model, o.session);
    std::vector<float> a_row(size_t(g.n_vocab)), b_row(size_t(g.n_vocab));
    const BackendSession::Step prompts[] = {{a_session.get(), g.prompt_ids, false, a_row},
                                            {&b, g.prompt_ids, false, b_row}};
    BackendSession::step_batch(prompts);
    Sequence a(std::move(a_session), a_row, g, vocab);
    bool a_on = true, b_on = true;
    for (int i = 0; i < o.max_steps && (a_on || b_on); ++i) {
      r.n_steps = i + 1;
      const int32_t pa = a_on ? a.pick() : -1;
      const int32_t pb = b_on ? metrics::argmax(b_row) : -1;
      if (a_on && size_t(i) < constrained.tokens.size() && pa != constrained.tokens[size_t(i)])
        a_on = part_or_fail(r, tok, p, exact, i, constrained.rows[size_t(i)],
                            constrained.tokens[size_t(i)], pa,
                            "the constrained sequence in a batch") &&
               false;
      if (b_on && size_t(i) < free_tokens.size() && pb != free_tokens[size_t(i)])
        b_on = part_or_fail(r, tok, p, exact, i, free_rows[size_t(i)], free_tokens[size_t(i)], pb,
                            "the unconstrained sequence in a batch") &&
               false;
      a_on = a_on && pa >= 0 && !vocab.is_stop(pa) && size_t(i + 1) < constrained.tokens.size();
      b_on = b_on && pb >= 0 && size_t(i + 1) < free_tokens.size();
      if (!r.failures.empty()) break;
      std::vector<BackendSession::Step> steps;
      if (a_on) steps.push_back({&a.session(), std::span<const int32_t>(&pa, 1), false, a_row});
      if (b_on) steps.push_back({&b, std::span<const int32_t>(&pb, 1), false, b_row});
      if (steps.empty()) break;
      BackendSession::step_batch(steps);
      if (a_on) {
        a.accepted_externally(std::span<const int32_t>(&pa, 1));
        a.set_row(a_row);
      }
    }
  } catch (const std::exception& e) {
    r.backend_error = e.what();
    fail(r, std::max(r.n_steps - 1, 0), fmt::format("backend call failed: {}", e.what()));
  }
  return r;
}

}  // namespace touchstone::structured
