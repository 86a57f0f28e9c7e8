// serving_verify.cpp - serving.speculative_verify (touchstone/serving.h).
#include <fmt/format.h>

#include <algorithm>

#include "row_compare.h"
#include "serving_internal.h"
#include "touchstone/metrics.h"

namespace touchstone::detail {
namespace {

// The backend's own greedy continuation: prefill the prompt, then decode its
// argmax `steps` times. tokens[k] is the argmax of rows[k] (row k at position
// prompt + k - 1).
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<Row> rows;
};

Greedy plain_greedy(const Model& m, const SessionOptions& so, std::span<const int32_t> prompt,
                    size_t steps) {
  Session s(m, so);
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
  const Model& m;
  const ServingOptions& o;
  const Profile& p;
  std::span<const int32_t> prompt, golden;
  const Greedy& plain;
};

// One speculative run with drafts of k tokens into r; false once it failed.
bool verify_run(const VerifyRun& v, int k, std::mt19937_64& rng, CaseResult& r, DriftMeter& m) {
  Session s(v.m, v.o.session);
  const size_t steps = v.plain.tokens.size(), P = v.prompt.size();
  std::vector<int32_t> out = {metrics::argmax(s.prefill(v.prompt))};
  size_t proposed = 0, accepted_total = 0;
  const std::string where = fmt::format(" (speculative verify, K = {})", k);
  if (out[0] != v.plain.tokens[0]) {  // the same prefill call as the plain run
    if (r.first_logit_violation_step < 0) {
      r.first_logit_violation_step = int(P) - 1;
      r.first_logit_violation =
          fmt::format("the prompt's greedy token is {}, {} in the plain run{}", out[0],
                      v.plain.tokens[0], where);
    }
    return false;
  }
  std::uniform_int_distribution<int32_t> any(0, v.m.n_vocab() - 1);
  while (out.size() < steps) {
    const size_t j = out.size();  // index of the next token to generate
    std::vector<int32_t> input = {out.back()};
    for (size_t i = 0; i < size_t(k) && j + i < v.golden.size(); ++i)
      input.push_back(v.golden[j + i]);
    if (input.size() > 1 && rng() % 2) {  // a seeded wrong draft
      const size_t w = 1 + size_t(rng() % (input.size() - 1));
      input[w] = (input[w] + 1 + any(rng) % (v.m.n_vocab() - 1)) % v.m.n_vocab();
    }
    const int32_t pos0 = s.position();
    const std::vector<float> all = s.prefill_all(input);
    const size_t V = size_t(v.m.n_vocab());
    size_t acc = 0;
    while (acc + 1 < input.size() &&
           metrics::argmax(std::span<const float>(all.data() + acc * V, V)) == input[acc + 1])
      ++acc;
    proposed += input.size() - 1;
    accepted_total += acc;
    for (size_t i = 0; i <= acc && j + i <= steps; ++i) {
      const std::span<const float> row(all.data() + i * V, V);
      const size_t g = j + i;  // plain row index at the same position
      if (g >= steps) break;
      m.add(v.plain.rows[g], row);
      compare_row(v.plain.rows[g], row, pos0 + int(i), v.o.batch_invariant,
                  "TS_CAP_BATCH_INVARIANT", v.p, where, r);
      const int32_t tok = i < acc ? input[i + 1] : metrics::argmax(row);
      if (tok != v.plain.tokens[g]) {
        if (metrics::top2_margin(v.plain.rows[g]) < v.p.near_tie_margin) return true;  // near tie
        if (r.first_logit_violation_step < 0) {
          r.first_logit_violation_step = int(P + g) - 1;
          r.first_logit_violation =
              fmt::format("token #{} is {} after verification, {} in plain greedy decoding{}", g,
                          tok, v.plain.tokens[g], where);
        }
        return false;
      }
      out.push_back(tok);
    }
    s.rewind(pos0 + 1 + int32_t(acc));
  }
  m.point.label += fmt::format(", {} of {} drafted tokens accepted", accepted_total, proposed);
  return true;
}

}  // namespace

CaseResult check_speculative(const Model& model, std::span<const int32_t> prompt,
                             std::span<const int32_t> continuation, const Profile& profile,
                             const ServingOptions& opt) {
  CaseResult r;
  r.name = "serving.speculative_verify";
  const size_t steps = std::max<size_t>(1, size_t(opt.plan.decode_steps));
  const Greedy plain = plain_greedy(model, opt.session, prompt, steps);
  const VerifyRun v{model, opt, profile, prompt, continuation, plain};
  for (int k : opt.plan.draft_lengths) {
    std::mt19937_64 rng(opt.plan.seed ^ uint64_t(k) * 0x9e3779b97f4a7c15ull);
    DriftMeter m{{fmt::format("K = {}", k), k}};
    verify_run(v, k, rng, r, m);
    r.drift.push_back(m.point);
  }
  finish_rows(r, "speculative verification differs from plain decoding");
  return r;
}

}  // namespace touchstone::detail
