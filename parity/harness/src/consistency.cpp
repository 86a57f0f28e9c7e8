// consistency.cpp - see touchstone/harness/consistency.h.
#include "touchstone/harness/consistency.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "row_compare.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone {
namespace {

using Rows = std::vector<std::vector<float>>;  // logits after each position

// Token by token: prefill the first, decode the rest.
Rows decode_rows(BackendSession& s, std::span<const int32_t> t) {
  Rows rows;
  rows.push_back(s.prefill(t.first(1)));
  for (size_t i = 1; i < t.size(); ++i) {
    rows.emplace_back(rows.back().size());
    s.decode(t[i], rows.back());
  }
  return rows;
}

Rows fresh_decode_rows(const BackendModel& m, const BackendSessionOptions& o,
                       std::span<const int32_t> t) {
  BackendSession s(m, o);
  return decode_rows(s, t);
}

// Compares `test` rows with `ref` rows at the given positions into r.
void compare(const Rows& ref, const std::vector<std::pair<size_t, const std::vector<float>*>>& test,
             bool bitwise, const Profile& p, CaseResult& r) {
  for (const auto& [pos, row] : test)
    detail::compare_row(ref[pos], *row, int(pos), bitwise, "TS_CAP_BITWISE_DETERMINISM", p, "", r);
}

void finish(CaseResult& r, const std::string& what) { detail::finish_rows(r, what); }

CaseResult prefill_vs_decode(const BackendModel& m, std::span<const int32_t> t, const Rows& ref,
                             const Profile& p, const ConsistencyOptions& o) {
  CaseResult r;
  r.name = "consistency.prefill_vs_decode";
  BackendSession s(m, o.session);
  std::vector<std::vector<float>> rows;
  std::vector<std::pair<size_t, const std::vector<float>*>> test;
  if (o.all_positions) {
    const std::vector<float> all = s.prefill_all(t);
    const size_t v = ref[0].size();
    for (size_t i = 0; i < t.size(); ++i)
      rows.emplace_back(all.begin() + std::ptrdiff_t(i * v),
                        all.begin() + std::ptrdiff_t((i + 1) * v));
    for (size_t i = 0; i < t.size(); ++i) test.emplace_back(i, &rows[i]);
  } else {
    rows.push_back(s.prefill(t));
    test.emplace_back(t.size() - 1, &rows[0]);
  }
  compare(ref, test, false, p, r);
  finish(r, o.all_positions ? "all-position prefill differs from decode"
                            : "prefill's last logits differ from decode");
  return r;
}

CaseResult chunked_prefill(const BackendModel& m, std::span<const int32_t> t, const Rows& ref,
                           const Profile& p, const ConsistencyOptions& o) {
  CaseResult r;
  r.name = "consistency.chunked_prefill";
  // 3: even a short sequence gets chunks that continue it with several tokens.
  std::vector<int32_t> sizes = {1, 3, 7, 64};
  for (int32_t b : o.buckets)
    if (std::find(sizes.begin(), sizes.end(), b) == sizes.end()) sizes.push_back(b);
  for (int32_t c : sizes) {
    BackendSession s(m, o.session);
    Rows rows;
    std::vector<std::pair<size_t, const std::vector<float>*>> test;
    std::vector<size_t> ends;
    for (size_t at = 0; at < t.size(); at += size_t(c)) {
      const size_t n = std::min(size_t(c), t.size() - at);
      rows.push_back(s.prefill(t.subspan(at, n)));
      ends.push_back(at + n - 1);
    }
    for (size_t i = 0; i < rows.size(); ++i) test.emplace_back(ends[i], &rows[i]);
    const int before = r.first_logit_violation_step;
    compare(ref, test, false, p, r);
    if (before < 0 && r.first_logit_violation_step >= 0)
      r.first_logit_violation += fmt::format(" (chunks of {})", c);
  }
  finish(r, "chunked prefill differs from decode");
  return r;
}

CaseResult rewind_replay(const BackendModel& m, std::span<const int32_t> t, const Rows& ref,
                         const Profile& p, const ConsistencyOptions& o) {
  CaseResult r;
  r.name = "consistency.rewind_replay";
  BackendSession s(m, o.session);
  std::vector<int32_t> other(t.rbegin(), t.rend());  // unrelated tokens first
  s.prefill(other);
  s.rewind(0);
  const Rows dirty = decode_rows(s, t);
  std::vector<std::pair<size_t, const std::vector<float>*>> test;
  for (size_t i = 0; i < dirty.size(); ++i) test.emplace_back(i, &dirty[i]);
  // Rewind to the middle and replay the second half.
  const size_t half = t.size() / 2;
  s.rewind(int32_t(half));
  Rows again;
  again.push_back(s.prefill(t.subspan(half, 1)));
  for (size_t i = half + 1; i < t.size(); ++i) {
    again.emplace_back(again.back().size());
    s.decode(t[i], again.back());
  }
  for (size_t i = 0; i < again.size(); ++i) test.emplace_back(half + i, &again[i]);
  compare(ref, test, o.bitwise, p, r);
  finish(r, "rewind: replay after rewind differs from a fresh session");
  return r;
}

CaseResult repeat(const BackendModel& m, std::span<const int32_t> t, const Rows& ref,
                  const Profile& p, const ConsistencyOptions& o, bool threads) {
  CaseResult r;
  r.name = threads ? "consistency.threads" : "consistency.run_to_run";
  std::vector<Rows> runs;
  std::vector<int> counts;
  if (threads) {
    for (int n : {1, 2, 3}) {
      BackendSessionOptions so = o.session;
      so.n_threads = n;
      runs.push_back(fresh_decode_rows(m, so, t));
      counts.push_back(n);
    }
  } else {
    runs.push_back(fresh_decode_rows(m, o.session, t));
  }
  for (size_t k = 0; k < runs.size(); ++k) {
    std::vector<std::pair<size_t, const std::vector<float>*>> test;
    for (size_t i = 0; i < runs[k].size(); ++i) test.emplace_back(i, &runs[k][i]);
    const int before = r.first_logit_violation_step;
    compare(ref, test, o.bitwise, p, r);
    if (threads && before < 0 && r.first_logit_violation_step >= 0)
      r.first_logit_violation += fmt::format(" ({} threads)", counts[k]);
  }
  finish(r, threads ? "thread count changes the logits" : "a second run differs from the first");
  return r;
}

}  // namespace

std::vector<CaseResult> check_consistency(const BackendModel& model,
                                          std::span<const int32_t> tokens, const Profile& profile,
                                          const ConsistencyOptions& opt) {
  using Clock = std::chrono::steady_clock;
  const Rows ref = fresh_decode_rows(model, opt.session, tokens);
  std::vector<CaseResult> out;
  auto timed = [&](auto&& fn) {
    const auto t0 = Clock::now();
    CaseResult r = fn();
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    out.push_back(std::move(r));
  };
  timed([&] { return prefill_vs_decode(model, tokens, ref, profile, opt); });
  timed([&] { return chunked_prefill(model, tokens, ref, profile, opt); });
  timed([&] { return rewind_replay(model, tokens, ref, profile, opt); });
  timed([&] { return repeat(model, tokens, ref, profile, opt, true); });
  timed([&] { return repeat(model, tokens, ref, profile, opt, false); });
  return out;
}

}  // namespace touchstone
