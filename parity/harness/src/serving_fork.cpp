// serving_fork.cpp - serving.prefix_fork (touchstone/serving.h).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <set>

#include "row_compare.h"
#include "serving_internal.h"

namespace touchstone::detail {
namespace {

// Continues `s` with needle[from..]: the rest of the prompt as one prefill
// chunk, then one decode per token; the rows and their positions.
PositionedRows continue_from(Session& s, std::span<const int32_t> needle, size_t from,
                             size_t prompt_len) {
  PositionedRows out;
  size_t at = from;
  if (at < prompt_len) {
    out.rows.push_back(s.prefill(needle.subspan(at, prompt_len - at)));
    out.positions.push_back(int(prompt_len - 1));
    at = prompt_len;
  }
  for (; at < needle.size(); ++at) {
    out.rows.emplace_back(size_t(s.n_vocab()));
    if (at == 0) {
      out.rows.back() = s.prefill(needle.first(1));
    } else {
      s.decode(needle[at], out.rows.back());
    }
    out.positions.push_back(int(at));
  }
  return out;
}

// A fresh session that prefills needle[0..n) in one chunk and continues the same way.
PositionedRows fresh_from(const Model& m, const SessionOptions& so, std::span<const int32_t> needle,
                          size_t n, size_t prompt_len) {
  Session s(m, so);
  if (n > 0) s.prefill(needle.first(n));
  return continue_from(s, needle, n, prompt_len);
}

}  // namespace

// The source prefills the prompt in one chunk and decodes a few tokens; forks
// at 1, the middle and the end of the prompt, and at its current position,
// continue the needle; then the source itself continues. Each is compared with
// a fresh session. Bits are required where the computation is the same call
// sequence (a fork at the end of the prompt, the source) on a bitwise backend,
// and everywhere on a batch-invariant one.
CaseResult check_prefix_fork(const Model& model, std::span<const int32_t> needle, size_t prompt_len,
                             const Profile& profile, const ServingOptions& opt) {
  CaseResult r;
  r.name = "serving.prefix_fork";
  const std::string mode = model.library()->has_fork() ? "fork_session" : "emulated by the harness";
  Session src(model, opt.session);
  src.prefill(needle.first(prompt_len));
  const size_t ahead = std::min(prompt_len + 4, needle.size());
  for (size_t at = prompt_len; at < ahead; ++at) {
    Row row(size_t(model.n_vocab()));
    src.decode(needle[at], row);
  }
  const std::set<size_t> points = {1, std::max<size_t>(1, prompt_len / 2), prompt_len, ahead};
  for (size_t n : points) {
    std::unique_ptr<Session> fork = src.fork(int32_t(n));
    const PositionedRows got = continue_from(*fork, needle, n, prompt_len);
    const PositionedRows want = fresh_from(model, opt.session, needle, n, prompt_len);
    const bool same_calls = n == prompt_len;  // both prefilled the prompt in one chunk
    const bool bits = opt.batch_invariant || (opt.bitwise && same_calls);
    const std::string label =
        fmt::format("fork at n_prefix {} of a {}-token prompt", n, prompt_len);
    DriftMeter m{{label, int(n)}};
    compare_rows(want, got, bits,
                 opt.batch_invariant ? "TS_CAP_BATCH_INVARIANT" : "TS_CAP_BITWISE_DETERMINISM",
                 profile, fmt::format(" ({}; {})", label, mode), r, m);
    r.drift.push_back(m.point);
  }
  // The source after its forks: as if they never happened.
  PositionedRows after = continue_from(src, needle, ahead, prompt_len);
  Session fresh(model, opt.session);
  fresh.prefill(needle.first(prompt_len));
  for (size_t at = prompt_len; at < ahead; ++at) {
    Row row(size_t(model.n_vocab()));
    fresh.decode(needle[at], row);
  }
  const PositionedRows want = continue_from(fresh, needle, ahead, prompt_len);
  DriftMeter m{{"the source after its forks", int(ahead)}};
  compare_rows(want, after, opt.bitwise, "TS_CAP_BITWISE_DETERMINISM", profile,
               fmt::format(" (the source session after forking; {})", mode), r, m);
  r.drift.push_back(m.point);
  finish_rows(r, "a forked KV prefix differs from a fresh prefill");
  return r;
}

}  // namespace touchstone::detail
