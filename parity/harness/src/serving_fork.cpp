// serving_fork.cpp - serving.prefix_fork (touchstone/harness/serving.h).
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <random>
#include <set>

#include "row_compare.h"
#include "serving_internal.h"
#include "touchstone/common/error.h"

namespace touchstone::detail {
namespace {

// The layer taps of a branch's calls (floats > 0: taps on), one record per
// row; the first error reading them stops the log (the rows still count).
struct TapLog {
  size_t floats = 0;
  std::vector<Row> taps;
  std::string error;
};

// Feeds tokens[from, to) to s: the first `chunk` of them as one prefill, then
// one decode each; the rows and their positions, each call's taps into `log`.
PositionedRows feed(BackendSession& s, std::span<const int32_t> tokens, size_t from, size_t to,
                    size_t chunk, TapLog& log) {
  PositionedRows out;
  auto called = [&] {
    if (log.floats == 0 || !log.error.empty()) return;
    try {
      log.taps.push_back(s.read_taps(log.floats));
    } catch (const std::exception& e) {
      log.error = e.what();
    }
  };
  size_t at = from;
  if (chunk > 0 && at < to) {
    const size_t n = std::min(chunk, to - at);
    out.rows.push_back(s.prefill(tokens.subspan(at, n)));
    called();
    at += n;
    out.positions.push_back(int(at) - 1);
  }
  for (; at < to; ++at) {
    out.rows.emplace_back(size_t(s.n_vocab()));
    if (at == 0) {
      out.rows.back() = s.prefill(tokens.first(1));
    } else {
      s.decode(tokens[at], out.rows.back());
    }
    called();
    out.positions.push_back(int(at));
  }
  return out;
}

// One sequence checked two ways: `got` (a fork, or the source) and `want` (a
// fresh session fed the same tokens), both fed in the same calls from `at` on.
struct Branch {
  std::string label;
  std::vector<int32_t> tokens;
  std::unique_ptr<BackendSession> got, want;
  bool bits = false;  // bitwise required, because of `claim`
  const char* claim = "";
  size_t at = 0;  // tokens fed so far
};

struct ForkRun {
  const Profile& profile;
  const ServingOptions& opt;
  std::string mode;
  CaseResult& r;

  // Layer taps on in the branch's sessions (a fork starts with them off).
  void taps_on(Branch& b) const {
    if (opt.tap_floats == 0) return;
    try {
      b.got->set_taps(true);
      b.want->set_taps(true);
    } catch (const std::exception&) {  // read_taps then fails, and the failure line says why
    }
  }

  // Feeds the branch up to `to` (the first `chunk` tokens as one prefill) and
  // compares; the first failure's layer is located from the calls' taps.
  void advance(Branch& b, size_t to, size_t chunk, const std::string& phase) {
    to = std::min(to, b.tokens.size());
    if (to <= b.at) return;
    TapLog want_taps{opt.tap_floats, {}, {}}, got_taps{opt.tap_floats, {}, {}};
    const PositionedRows want = feed(*b.want, b.tokens, b.at, to, chunk, want_taps);
    const PositionedRows got = feed(*b.got, b.tokens, b.at, to, chunk, got_taps);
    b.at = to;
    DriftMeter m{{fmt::format("{}, {}", b.label, phase), int(b.tokens.size())}};
    const bool failed_before = r.first_logit_violation_step >= 0;
    compare_rows(want, got, b.bits, b.claim, profile,
                 fmt::format(" ({}, {}; {})", b.label, phase, mode), r, m);
    r.drift.push_back(m.point);
    if (failed_before || r.first_logit_violation_step < 0) return;
    for (size_t i = 0; i < want.positions.size(); ++i) {  // the call that returned the row
      if (want.positions[i] < r.first_logit_violation_step) continue;
      try_locate(r, opt, [&] {
        for (const TapLog* t : {&want_taps, &got_taps}) {
          if (!t->error.empty()) throw Error(t->error);
          if (t->taps.size() <= i) throw Error("a call's taps are missing (a harness bug)");
        }
        note_layers(
            r, want_taps.taps[i], got_taps.taps[i], opt, b.bits, want.positions[i],
            fmt::format(" ({}, {}; taps of that call against a fresh session's)", b.label, phase));
      });
      return;
    }
  }
};

constexpr size_t kSuffix = 6;  // a fork's own tokens: a chunk of 3 and a decode, then 2 decodes

}  // namespace

// The source prefills the prompt in one chunk and decodes a few needle tokens.
// Forks at 1, the middle and the end of the prompt and at the source's
// position each continue with their own seeded suffix (a prefill chunk and a
// decode); then the source continues the needle; then every fork decodes the
// rest of its suffix. Each is compared with a fresh session fed the same
// tokens, so a fork that aliases its source's or a sibling's KV rows, or
// copies too few, shows. Bits are required where the calls are the same (a
// fork at the end of the prompt, the source) on a bitwise backend, and
// everywhere on a batch-invariant one; a backend whose bitwise claim stops at
// fork_session (TS_CAP_BITWISE_NOT_ACROSS_FORKS) is held to bits only before
// the first fork, and to the profile from then on.
CaseResult check_prefix_fork(const BackendModel& model, std::span<const int32_t> needle,
                             size_t prompt_len, const Profile& profile, const ServingOptions& opt) {
  CaseResult r;
  r.name = "serving.prefix_fork";
  ForkRun run{profile, opt,
              model.library()->has_fork() ? "fork_session" : "emulated by the harness", r};
  const char* claim = opt.batch_invariant ? "TS_CAP_BATCH_INVARIANT" : "TS_CAP_BITWISE_DETERMINISM";
  const size_t ahead = std::min(prompt_len + 4, needle.size());
  std::mt19937_64 rng(opt.plan.seed ^ 0xf0f0ull);
  // The same calls as its fresh twin: bits on a bitwise backend.
  Branch src{"the source session",
             {needle.begin(), needle.end()},
             nullptr,
             nullptr,
             opt.bitwise || opt.batch_invariant,
             opt.bitwise ? "TS_CAP_BITWISE_DETERMINISM" : "TS_CAP_BATCH_INVARIANT",
             0};
  const std::vector<int32_t> own = random_tokens(rng, 2, model.n_vocab());
  src.tokens.insert(src.tokens.end(), own.begin(), own.end());
  src.got = std::make_unique<BackendSession>(model, opt.session);
  src.want = std::make_unique<BackendSession>(model, opt.session);
  run.taps_on(src);
  run.advance(src, ahead, prompt_len, "before forking");
  std::vector<Branch> forks;
  for (size_t n : std::set<size_t>{1, std::max<size_t>(1, prompt_len / 2), prompt_len, ahead}) {
    Branch b{fmt::format("fork at n_prefix {} of a {}-token prompt", n, prompt_len),
             {needle.begin(), needle.begin() + std::ptrdiff_t(n)},
             src.got->fork(int32_t(n)),
             std::make_unique<BackendSession>(model, opt.session),
             opt.batch_invariant || (opt.fork_bitwise && n == prompt_len),
             claim,
             n};
    const std::vector<int32_t> suffix = random_tokens(rng, kSuffix, model.n_vocab());
    b.tokens.insert(b.tokens.end(), suffix.begin(), suffix.end());
    b.want->prefill(std::span<const int32_t>(b.tokens).first(n));
    run.taps_on(b);
    run.advance(b, n + 4, 3, "its own suffix");
    forks.push_back(std::move(b));
  }
  // The source's cells are now shared with its forks.
  src.bits = opt.batch_invariant || opt.fork_bitwise;
  src.claim = opt.batch_invariant ? "TS_CAP_BATCH_INVARIANT" : "TS_CAP_BITWISE_DETERMINISM";
  run.advance(src, src.tokens.size(), 0, "continued after its forks");
  for (Branch& b : forks) run.advance(b, b.tokens.size(), 0, "after its siblings and the source");
  finish_rows(r, "a forked KV prefix differs from a fresh prefill");
  return r;
}

}  // namespace touchstone::detail
