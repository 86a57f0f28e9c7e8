// serving_internal.h - what the serving checks (serving_*.cpp) share.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "touchstone/harness/serving.h"

namespace touchstone::detail {

using Row = std::vector<float>;

// Logits rows of one sequence, each with the position of the token it follows.
struct PositionedRows {
  std::vector<int> positions;
  std::vector<Row> rows;
};

// Accumulates one configuration's drift (DriftPoint) while rows are compared.
struct DriftMeter {
  DriftPoint point;
  void add(std::span<const float> ref, std::span<const float> test);
};

// Seeded token ids in [0, n_vocab).
std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n, int32_t n_vocab);

// Compares two row sets position by position into r and the meter (rows must
// be at the same positions; `where` is appended to a violation).
void compare_rows(const PositionedRows& ref, const PositionedRows& test, bool bitwise,
                  const std::string& claim, const Profile& p, const std::string& where,
                  CaseResult& r, DriftMeter& meter);

// content_isolation without a bitwise claim, one batch shape: its drift point
// (label and B), the needle's rows with the first filler contents (x) and with
// other contents (y), and the largest drift between two identical runs of either.
struct IsolationRuns {
  DriftPoint point;
  std::string where;
  PositionedRows x, y;
  double noise = 0.0;
};

// Judges every shape against one baseline: 4 x the largest noise of any shape
// (0: bitwise), capped at the profile's logits_max_abs_max. A backend whose
// repeats differ (a server batching by arrival time) has noise somewhere; one
// whose repeats never differ must give the needle the same bits with other
// contents. The runs that set the noise are judged against the needle alone
// before (serving_batch.cpp). Appends each shape's x-vs-y drift to r.drift;
// violations "isolation_max_abs" / "non_finite".
void judge_isolation(const std::vector<IsolationRuns>& runs, const Profile& profile, CaseResult& r);

// Layer taps of the serving checks (o.tap_floats > 0). The first tap record
// entry, layers in order and points in order within a layer, where `test`
// differs from `ref`: any bit when `bitwise`, else NMSE over
// o.layer_tolerance; nullopt when every tap matches (or a record has the
// wrong size).
std::optional<LayerDivergence> first_divergent_tap(std::span<const float> ref,
                                                   std::span<const float> test,
                                                   const ServingOptions& o, bool bitwise,
                                                   int position);
// Locates r's first failure once: its first divergent layer at `position`
// (the last position of the call whose taps were read), `where` saying which
// sequence; finish_rows adds the line (layer_line).
void note_layers(CaseResult& r, std::span<const float> ref, std::span<const float> test,
                 const ServingOptions& o, bool bitwise, int position, const std::string& where);
// Runs `locate` (which reads taps and calls note_layers) for r's first
// failure, once, when taps are on: a backend or harness error there is kept
// as r.layer_not_located (a line of the failure), never a verdict of its own.
void try_locate(CaseResult& r, const ServingOptions& o, const std::function<void()>& locate);

// Runs fn, timing it into the result it returns.
template <typename Fn>
CaseResult timed(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  CaseResult r = fn();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

struct Needles;  // serving_batch.h
std::vector<CaseResult> check_batches(const BackendModel& model, const Needles& needles,
                                      const Profile& profile, const ServingOptions& opt);
CaseResult check_prefix_fork(const BackendModel& model, std::span<const int32_t> needle,
                             size_t prompt_len, const Profile& profile, const ServingOptions& opt);
CaseResult check_speculative(const BackendModel& model, std::span<const int32_t> prompt,
                             std::span<const int32_t> continuation, const Profile& profile,
                             const ServingOptions& opt);

}  // namespace touchstone::detail
