// multimodal_serving.cpp - multimodal.serving (touchstone/harness/multimodal.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "row_compare.h"
#include "touchstone/common/error.h"
#include "touchstone/harness/multimodal.h"
#include "touchstone/harness/recorder.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone {
namespace {

using Rows = std::vector<std::vector<float>>;

// The case's prompt with its image, then n decodes of its golden continuation: the
// prompt's last row and each decode's row.
Rows alone(const BackendModel& model, const BackendSessionOptions& so, const GoldenCase& g, int n) {
  BackendSession s(model, so);
  Rows rows{prefill_case_prompt(s, g)};
  for (int i = 0; i < n; ++i) {
    rows.emplace_back(size_t(s.n_vocab()));
    s.decode(g.greedy_ids[size_t(i)], rows.back());
  }
  return rows;
}

// Decode step i of every session as one step_batch call; rows appended per session.
void batched_decodes(std::span<BackendSession* const> sessions,
                     std::span<const GoldenCase* const> cases, int n, std::vector<Rows>& rows) {
  for (int i = 0; i < n; ++i) {
    std::vector<BackendSession::Step> steps;
    for (size_t k = 0; k < sessions.size(); ++k) {
      rows[k].emplace_back(size_t(sessions[k]->n_vocab()));
      steps.push_back({sessions[k], std::span<const int32_t>(&cases[k]->greedy_ids[size_t(i)], 1),
                       false, rows[k].back()});
    }
    BackendSession::step_batch(steps);
  }
}

// Compares rows[i] with want[i]; positions from the prompt's last.
void compare(const Rows& want, const Rows& got, int first_position, bool bitwise,
             const std::string& claim, const Profile& p, const std::string& where, CaseResult& r) {
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (!detail::compare_row(want[i], got[i], first_position + int(i), bitwise, claim, p, where, r))
      return;
}

}  // namespace

CaseResult check_multimodal_serving(const BackendModel& model, const GoldenCase& a,
                                    const GoldenCase& b, const Profile& p,
                                    const ServingOptions& opt, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  CaseResult r;
  r.name = "multimodal.serving";
  if (a.prompt_ids != b.prompt_ids || a.frame_positions() != b.frame_positions() ||
      !a.has_image() || !b.has_image())
    throw Error("multimodal.serving: cases '{}' and '{}' are not one prompt with two images",
                a.name, b.name);
  const int n = std::min({steps, int(a.greedy_ids.size()), int(b.greedy_ids.size())});
  const BackendSessionOptions& so = opt.session;
  const Rows want_a = alone(model, so, a, n), want_b = alone(model, so, b, n);
  const int last = int(a.prompt_ids.size()) + a.image_tokens - 1;  // the prompt's last position
  if (detail::row_diff(want_a[0], want_b[0]).nmse <= 0.0) {
    r.failures.push_back(fmt::format(
        "multimodal.serving: '{}' and '{}' give the same logits: the images cannot be told "
        "apart here",
        a.name, b.name));
  }
  // Batched: the two image sequences and a text-only filler in one step_batch per step.
  GoldenCase filler = a;
  filler.image_tokens = 0;
  filler.image_embeddings.clear();
  filler.image_frames.clear();
  BackendSession sa(model, so), sb(model, so), sf(model, so);
  std::vector<Rows> rows(3);
  rows[0].push_back(prefill_case_prompt(sa, a));
  rows[1].push_back(prefill_case_prompt(sb, b));
  rows[2].push_back(prefill_case_prompt(sf, filler));
  BackendSession* sessions[] = {&sa, &sb, &sf};
  const GoldenCase* cases[] = {&a, &b, &a};
  if (opt.runs_batch(3)) batched_decodes(sessions, cases, n, rows);
  const std::string inv = "TS_CAP_BATCH_INVARIANT";
  compare(want_a, rows[0], last, opt.batch_invariant, inv, p, " (batched, image a)", r);
  compare(want_b, rows[1], last, opt.batch_invariant, inv, p, " (batched, image b)", r);
  // Forked at a's prompt end (a native fork: an emulated one replays tokens only): the
  // fork decodes a's tokens while the source, rewound there, decodes other tokens at the
  // same positions, each right after the fork's call (rows shared instead of copied would
  // hand the fork the source's rows at its next step); the fork's rows against a's alone
  // run.
  if (sa.fork_native()) {
    sa.rewind(last + 1);
    std::unique_ptr<BackendSession> fork = sa.fork(last + 1);
    Rows forked;
    std::vector<float> source_row(size_t(sa.n_vocab()));
    for (int i = 0; i < n; ++i) {
      forked.emplace_back(size_t(fork->n_vocab()));
      fork->decode(a.greedy_ids[size_t(i)], forked.back());
      // another token than the fork's (b's continuation may equal a's), after the fork's
      // step: a fork reading the source's rows sees it at its next step
      const int32_t other = (a.greedy_ids[size_t(i)] + 1) % sa.n_vocab();
      sa.decode(other, source_row);
    }
    compare(Rows(want_a.begin() + 1, want_a.end()), forked, last + 1, opt.fork_bitwise,
            "TS_CAP_BITWISE_DETERMINISM across forks", p, " (forked after image a)", r);
  }
  r.n_total = r.n_steps;
  detail::finish_rows(r, "multimodal.serving");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace touchstone
