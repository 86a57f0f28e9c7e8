// serving.cpp - see touchstone/harness/serving.h: the plans, the shared pieces and the
// entry point. The checks: serving_batch.cpp, serving_fork.cpp, serving_verify.cpp.
#include "touchstone/harness/serving.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "row_compare.h"
#include "serving_batch.h"
#include "serving_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone {

ServingPlan ServingPlan::quick() {
  ServingPlan p;
  p.batch_sizes = {2, 4};
  p.needle_length = 264;
  p.filler_lengths = {72, 40, 24};
  p.filler_min = 10;
  p.filler_max = 32;
  p.verify_max = 9;
  p.decode_steps = 16;
  p.draft_lengths = {1, 4, 16};
  return p;
}

ServingPlan ServingPlan::smoke() {
  ServingPlan p;
  p.batch_sizes = {3};
  p.needle_length = 72;
  p.filler_lengths = {40, 24};
  p.filler_min = 10;
  p.filler_max = 16;
  p.verify_max = 5;
  p.decode_steps = 8;
  p.draft_lengths = {4};
  return p;
}

ServingPlan ServingPlan::full() {
  ServingPlan p;
  p.batch_sizes = {2, 4, 8, 16};
  p.needle_length = 2100;
  p.filler_lengths = {2100, 520, 264, 136, 72, 40};
  p.filler_min = 10;
  p.filler_max = 2048;
  p.verify_max = 17;
  p.decode_steps = 16;
  p.draft_lengths = {1, 2, 4, 8, 16};
  return p;
}

ServingPlan ServingPlan::named(const std::string& name) {
  if (name == "smoke") return smoke();
  if (name == "quick") return quick();
  if (name == "full") return full();
  throw Error("unknown serving plan '{}' (known: smoke, quick, full)", name);
}

int32_t ServingPlan::context_needed(size_t needle_tokens) const {
  // The long sequences; a decoding filler (its prompt, then up to verify_max
  // tokens per needle step); the needle with a fork's suffix or a verify's drafts.
  size_t n = std::max(needle_tokens + 2 * size_t(verify_max) + 64, size_t(needle_length));
  for (int32_t l : filler_lengths) n = std::max(n, size_t(l));
  const size_t filler = size_t(filler_max) + size_t(decode_steps + 2) * size_t(verify_max);
  return int32_t(std::max(n, filler) + 1);
}

ServingOptions serving_options(const ts_capabilities& caps, const BackendSessionOptions& session,
                               ServingPlan plan) {
  ServingOptions o;
  o.session = session;
  o.bitwise = (caps.flags & TS_CAP_BITWISE_DETERMINISM) != 0;
  o.fork_bitwise = o.bitwise && (caps.flags & TS_CAP_BITWISE_NOT_ACROSS_FORKS) == 0;
  const uint32_t path_bit = 1u << unsigned(session.weight_path);
  o.batch_invariant = (caps.flags & TS_CAP_BATCH_INVARIANT) != 0 &&
                      (caps.batch_invariant_paths == 0 || (caps.batch_invariant_paths & path_bit));
  o.all_positions = (caps.flags & TS_CAP_ALL_POSITION_LOGITS) != 0;
  o.max_batch = caps.max_batch;
  o.plan = std::move(plan);
  return o;
}

bool ServingOptions::runs(const std::string& check) const {
  return checks.empty() || std::find(checks.begin(), checks.end(), check) != checks.end();
}

bool ServingOptions::runs_batch(int b) const {
  return b >= 2 && (max_batch <= 0 || b <= max_batch);
}

std::string ServingOptions::no_rows_reason() const {
  if (std::ranges::none_of(plan.batch_sizes, [&](int b) { return runs_batch(b); })) {
    return fmt::format(
        "the backend's max_batch ({}) is below every batch size of the serving plan ({}): no "
        "batch ran, no row was compared",
        max_batch, fmt::join(plan.batch_sizes, ", "));
  }
  return "no row was compared";
}

size_t ServingOptions::n_checks() const {
  size_t n = 0;
  for (const std::string& c : serving_check_names()) n += runs(c) ? 1 : 0;
  return n;
}

const std::vector<std::string>& serving_check_names() {
  static const std::vector<std::string> names = {"serving.batch_invariance",
                                                 "serving.content_isolation", "serving.prefix_fork",
                                                 "serving.speculative_verify"};
  return names;
}

namespace {

// The needle extended to the plan's needle_length: the other cases' tokens,
// then seeded ids.
std::vector<int32_t> extended(const std::vector<int32_t>& needle, const ServingOptions& opt,
                              int32_t n_vocab) {
  const size_t n = std::max(needle.size(), size_t(opt.plan.needle_length));
  std::vector<int32_t> out = needle;
  for (size_t i = 0; out.size() < n && i < opt.extension.size(); ++i) {
    if (opt.extension[i] >= 0 && opt.extension[i] < n_vocab) out.push_back(opt.extension[i]);
  }
  std::mt19937_64 rng(opt.plan.seed ^ 0x10a6ull);
  const std::vector<int32_t> rest = detail::random_tokens(rng, n - out.size(), n_vocab);
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace

std::vector<CaseResult> check_serving(const BackendModel& model, std::span<const int32_t> prompt,
                                      std::span<const int32_t> continuation, const Profile& profile,
                                      const ServingOptions& opt) {
  if (prompt.empty()) throw Error("serving checks: the needle case has an empty prompt");
  std::vector<int32_t> needle(prompt.begin(), prompt.end());
  const size_t steps = std::min(continuation.size(), size_t(opt.plan.decode_steps));
  needle.insert(needle.end(), continuation.begin(), continuation.begin() + std::ptrdiff_t(steps));
  const std::vector<int32_t> long_needle = extended(needle, opt, model.n_vocab());
  const detail::Needles needles{needle, long_needle, prompt.size()};
  std::vector<CaseResult> out;
  if (opt.runs("serving.batch_invariance") || opt.runs("serving.content_isolation"))
    out = detail::check_batches(model, needles, profile, opt);
  if (opt.runs("serving.prefix_fork")) {
    out.push_back(detail::timed(
        [&] { return detail::check_prefix_fork(model, needle, prompt.size(), profile, opt); }));
  }
  if (opt.all_positions && opt.runs("serving.speculative_verify")) {
    out.push_back(detail::timed(
        [&] { return detail::check_speculative(model, prompt, continuation, profile, opt); }));
  }
  return out;
}

namespace detail {

void DriftMeter::add(std::span<const float> ref, std::span<const float> test) {
  ++point.rows;
  const RowDiff d = row_diff(ref, test);
  point.nmse_max = std::max(point.nmse_max, d.nmse);
  point.max_abs = std::max(point.max_abs, d.max_abs);
  if (std::memcmp(ref.data(), test.data(), ref.size() * sizeof(float)) != 0) point.bitwise = false;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n, int32_t n_vocab) {
  std::uniform_int_distribution<int32_t> id(0, n_vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = id(rng);
  return t;
}

void compare_rows(const PositionedRows& ref, const PositionedRows& test, bool bitwise,
                  const std::string& claim, const Profile& p, const std::string& where,
                  CaseResult& r, DriftMeter& meter) {
  if (ref.positions != test.positions) {
    throw Error("serving check{}: rows at different positions (a harness bug)", where);
  }
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    meter.add(ref.rows[i], test.rows[i]);
    compare_row(ref.rows[i], test.rows[i], ref.positions[i], bitwise, claim, p, where, r);
  }
}

}  // namespace detail
}  // namespace touchstone
