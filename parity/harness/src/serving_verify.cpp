// serving_verify.cpp - serving.speculative_verify (touchstone/harness/serving.h).
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "row_compare.h"
#include "serving_internal.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone::detail {
namespace {

// The backend's own greedy continuation: prefill the prompt, then decode its
// argmax `steps` times. tokens[k] is the argmax of rows[k] (row k at position
// prompt + k - 1).
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<Row> rows;
};

Greedy plain_greedy(const BackendModel& m, const BackendSessionOptions& so,
                    std::span<const int32_t> prompt, size_t steps) {
  BackendSession s(m, so);
  Greedy g;
  g.rows.push_back(s.prefill(prompt));
  g.tokens.push_back(metrics::argmax(g.rows.back()));
  while (g.tokens.size() < steps) {
    g.rows.emplace_back(size_t(m.n_vocab()));
    s.decode(g.tokens.back(), g.rows.back());
    g.tokens.push_back(metrics::argmax(g.rows.back()));
  }
  return g;
}

struct VerifyRun {
  const BackendModel& m;
  const ServingOptions& o;
  const Profile& p;
  std::span<const int32_t> prompt, golden;
  const Greedy& plain;
};

// One speculative sequence with drafts of k tokens: propose() the next verify
// input, judge() the all-position rows it returned, until done.
struct Verifier {
  const VerifyRun& v;
  int k;
  std::string where;
  std::mt19937_64 rng;
  DriftMeter meter;
  std::unique_ptr<BackendSession> s;
  std::vector<int32_t> out, input;
  int32_t pos0 = 0;
  size_t proposed = 0, accepted = 0;
  bool done = false;

  Verifier(const VerifyRun& run, int drafts, const std::string& label)
      : v(run),
        k(drafts),
        where(fmt::format(" (speculative verify, {})", label)),
        rng(run.o.plan.seed ^ uint64_t(drafts) * 0x9e3779b97f4a7c15ull),
        meter{{label, drafts}},
        s(std::make_unique<BackendSession>(run.m, run.o.session)) {}

  // Prefills the prompt: its greedy token must be the plain run's (the same call).
  void start(CaseResult& r) {
    out = {metrics::argmax(s->prefill(v.prompt))};
    done = out.size() >= v.plain.tokens.size();
    if (out[0] == v.plain.tokens[0]) return;
    done = true;
    if (r.first_logit_violation_step >= 0) return;
    r.first_logit_violation_step = int(v.prompt.size()) - 1;
    r.first_logit_violation = fmt::format("the prompt's greedy token is {}, {} in the plain run{}",
                                          out[0], v.plain.tokens[0], where);
  }
  // [last, d1..dk]: drafts from the golden continuation, one seeded wrong.
  void propose() {
    const size_t j = out.size();  // index of the next token to generate
    input = {out.back()};
    for (size_t i = 0; i < size_t(k) && j + i < v.golden.size(); ++i)
      input.push_back(v.golden[j + i]);
    const int32_t V = v.m.n_vocab();
    if (input.size() > 1 && rng() % 2) {
      const size_t w = 1 + size_t(rng() % (input.size() - 1));
      input[w] =
          (input[w] + 1 + std::uniform_int_distribution<int32_t>(0, V - 1)(rng) % (V - 1)) % V;
    }
    pos0 = s->position();
  }
  void judge(std::span<const float> all, CaseResult& r);
};

void Verifier::judge(std::span<const float> all, CaseResult& r) {
  const size_t V = size_t(v.m.n_vocab()), steps = v.plain.tokens.size(), j = out.size();
  size_t acc = 0;
  while (acc + 1 < input.size() && metrics::argmax(all.subspan(acc * V, V)) == input[acc + 1])
    ++acc;
  proposed += input.size() - 1;
  accepted += acc;
  for (size_t i = 0; i <= acc && j + i < steps; ++i) {
    const std::span<const float> row = all.subspan(i * V, V);
    const size_t g = j + i;  // plain row index at the same position
    meter.add(v.plain.rows[g], row);
    compare_row(v.plain.rows[g], row, pos0 + int(i), v.o.batch_invariant, "TS_CAP_BATCH_INVARIANT",
                v.p, where, r);
    const int32_t tok = i < acc ? input[i + 1] : metrics::argmax(row);
    if (tok != v.plain.tokens[g]) {
      done = true;
      if (metrics::top2_margin(v.plain.rows[g]) < v.p.near_tie_margin) return;  // near tie
      if (r.first_logit_violation_step < 0) {
        r.first_logit_violation_step = int(v.prompt.size() + g) - 1;
        r.first_logit_violation =
            fmt::format("token #{} is {} after verification, {} in plain greedy decoding{}", g, tok,
                        v.plain.tokens[g], where);
      }
      return;
    }
    out.push_back(tok);
  }
  s->rewind(pos0 + 1 + int32_t(acc));
  done = out.size() >= steps;
  if (done)
    meter.point.label += fmt::format(", {} of {} drafted tokens accepted", accepted, proposed);
}

// Each K alone: one all-position prefill per verification.
void verify_alone(const VerifyRun& v, int k, CaseResult& r) {
  Verifier q(v, k, fmt::format("K = {}", k));
  q.start(r);
  while (!q.done) {
    q.propose();
    const std::vector<float> all = q.s->prefill_all(q.input);
    q.judge(all, r);
  }
  r.drift.push_back(q.meter.point);
}

// Every K at once (one K: two sequences): each round, the unfinished
// sequences verify their drafts in step_batch calls of all-position entries
// (at most max_batch each).
void verify_batched(const VerifyRun& v, CaseResult& r) {
  std::vector<int> ks = v.o.plan.draft_lengths;
  if (ks.size() == 1) ks.push_back(ks[0]);
  std::vector<std::unique_ptr<Verifier>> qs;
  for (int k : ks) {
    qs.push_back(std::make_unique<Verifier>(
        v, k, fmt::format("K = {}, verifying in step_batch beside the other sequences", k)));
    qs.back()->start(r);
  }
  const size_t V = size_t(v.m.n_vocab());
  const size_t most = v.o.max_batch > 0 ? size_t(v.o.max_batch) : qs.size();
  for (;;) {
    std::vector<Verifier*> live;
    for (auto& q : qs)
      if (!q->done) live.push_back(q.get());
    if (live.empty()) break;
    for (size_t at = 0; at < live.size(); at += most) {
      const size_t n = std::min(most, live.size() - at);
      std::vector<std::vector<float>> rows(n);
      std::vector<BackendSession::Step> steps;
      for (size_t i = 0; i < n; ++i) {
        Verifier& q = *live[at + i];
        q.propose();
        rows[i].assign(q.input.size() * V, 0.0f);
        steps.push_back({q.s.get(), q.input, true, rows[i]});
      }
      BackendSession::step_batch(steps);
      for (size_t i = 0; i < n; ++i) live[at + i]->judge(rows[i], r);
    }
  }
  for (auto& q : qs) r.drift.push_back(q->meter.point);
}

}  // namespace

CaseResult check_speculative(const BackendModel& model, std::span<const int32_t> prompt,
                             std::span<const int32_t> continuation, const Profile& profile,
                             const ServingOptions& opt) {
  CaseResult r;
  r.name = "serving.speculative_verify";
  const size_t steps = std::max<size_t>(1, size_t(opt.plan.decode_steps));
  const Greedy plain = plain_greedy(model, opt.session, prompt, steps);
  const VerifyRun v{model, opt, profile, prompt, continuation, plain};
  for (int k : opt.plan.draft_lengths) verify_alone(v, k, r);
  verify_batched(v, r);
  finish_rows(r, "speculative verification differs from plain decoding");
  return r;
}

}  // namespace touchstone::detail
