// serving_fork.cpp - serving.prefix_fork (touchstone/serving.h).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>

#include "row_compare.h"
#include "serving_internal.h"

namespace touchstone::detail {
namespace {

// Feeds tokens[from, to) to s: the first `chunk` of them as one prefill, then
// one decode each; the rows and their positions.
PositionedRows feed(Session& s, std::span<const int32_t> tokens, size_t from, size_t to,
                    size_t chunk) {
  PositionedRows out;
  size_t at = from;
  if (chunk > 0 && at < to) {
    const size_t n = std::min(chunk, to - at);
    out.rows.push_back(s.prefill(tokens.subspan(at, n)));
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
    out.positions.push_back(int(at));
  }
  return out;
}

// One sequence checked two ways: `got` (a fork, or the source) and `want` (a
// fresh session fed the same tokens), both fed in the same calls from `at` on.
struct Branch {
  std::string label;
  std::vector<int32_t> tokens;
  std::unique_ptr<Session> got, want;
  bool bits = false;  // bitwise required, because of `claim`
  const char* claim = "";
  size_t at = 0;  // tokens fed so far
};

struct ForkRun {
  const Profile& profile;
  const ServingOptions& opt;
  std::string mode;
  CaseResult& r;

  // Feeds the branch up to `to` (the first `chunk` tokens as one prefill) and compares.
  void advance(Branch& b, size_t to, size_t chunk, const std::string& phase) {
    to = std::min(to, b.tokens.size());
    if (to <= b.at) return;
    const PositionedRows want = feed(*b.want, b.tokens, b.at, to, chunk);
    const PositionedRows got = feed(*b.got, b.tokens, b.at, to, chunk);
    b.at = to;
    DriftMeter m{{fmt::format("{}, {}", b.label, phase), int(b.tokens.size())}};
    compare_rows(want, got, b.bits, b.claim, profile,
                 fmt::format(" ({}, {}; {})", b.label, phase, mode), r, m);
    r.drift.push_back(m.point);
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
CaseResult check_prefix_fork(const Model& model, std::span<const int32_t> needle, size_t prompt_len,
                             const Profile& profile, const ServingOptions& opt) {
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
  src.got = std::make_unique<Session>(model, opt.session);
  src.want = std::make_unique<Session>(model, opt.session);
  run.advance(src, ahead, prompt_len, "before forking");
  std::vector<Branch> forks;
  for (size_t n : std::set<size_t>{1, std::max<size_t>(1, prompt_len / 2), prompt_len, ahead}) {
    Branch b{fmt::format("fork at n_prefix {} of a {}-token prompt", n, prompt_len),
             {needle.begin(), needle.begin() + std::ptrdiff_t(n)},
             src.got->fork(int32_t(n)),
             std::make_unique<Session>(model, opt.session),
             opt.batch_invariant || (opt.fork_bitwise && n == prompt_len),
             claim,
             n};
    const std::vector<int32_t> suffix = random_tokens(rng, kSuffix, model.n_vocab());
    b.tokens.insert(b.tokens.end(), suffix.begin(), suffix.end());
    b.want->prefill(std::span<const int32_t>(b.tokens).first(n));
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
