// serving_batch_shape.cpp - the batch shapes (serving_batch.h).
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <set>

#include "serving_batch.h"
#include "serving_internal.h"

namespace touchstone::detail {
namespace {

// n tokens in `steps` seeded chunks (fewer when n < steps: one token each).
std::vector<size_t> split(std::mt19937_64& rng, size_t n, size_t steps) {
  if (n <= steps) return std::vector<size_t>(n, 1);
  std::set<size_t> cuts;
  std::uniform_int_distribution<size_t> at(1, n - 1);
  while (cuts.size() + 1 < steps) cuts.insert(at(rng));
  cuts.insert(n);
  std::vector<size_t> c;
  size_t prev = 0;
  for (size_t x : cuts) c.push_back(x - prev), prev = x;
  return c;
}

// Consecutive feeds of the given sizes; one of 2..verify_max tokens is an
// all-position entry half of the time when `all` allows.
std::vector<Feed> feeds_of(std::mt19937_64& rng, const std::vector<size_t>& sizes, bool all,
                           const ServingPlan& plan) {
  std::vector<Feed> f;
  size_t at = 0;
  for (size_t n : sizes) {
    const bool verify = all && n >= 2 && n <= size_t(plan.verify_max) && rng() % 2 == 0;
    f.push_back({at, n, verify});
    at += n;
  }
  return f;
}

// kNeedlePrefills' filler: a prompt at step 0, then each step a decode or
// (a third of the steps, with all-position logits) a verify of 2..verify_max.
std::vector<Feed> decoding_filler(std::mt19937_64& rng, size_t steps, bool all,
                                  const ServingPlan& plan) {
  std::uniform_int_distribution<int32_t> len(plan.filler_min, plan.filler_max);
  std::uniform_int_distribution<int32_t> verify(2, std::max(2, plan.verify_max));
  std::vector<Feed> f = {{0, size_t(len(rng)), false}};
  size_t at = f[0].n;
  for (size_t i = 0; i < steps; ++i) {
    const bool v = all && rng() % 3 == 0;
    f.push_back({at, v ? size_t(verify(rng)) : 1, v});
    at += f.back().n;
  }
  return f;
}

}  // namespace

const char* schedule_name(Schedule s) {
  return s == Schedule::kNeedleDecodes ? "long fillers prefill while the needle decodes"
                                       : "the long needle prefills while the fillers decode";
}

std::vector<Seq> make_cast(Schedule s, const Needles& needles, const ServingPlan& plan,
                           size_t n_fillers, bool all_positions, uint64_t content,
                           int32_t n_vocab) {
  std::mt19937_64 shape(plan.seed ^ (uint64_t(s) + 1) * 0x9e3779b97f4a7c15ull);
  std::mt19937_64 text(content ^ uint64_t(s));
  std::vector<Seq> cast(1);
  Seq& needle = cast[0];
  needle.name = "the needle";
  const size_t P = needles.prompt_len, S = needles.short_needle.size() - P + 1;
  if (s == Schedule::kNeedleDecodes) {
    needle.tokens.assign(needles.short_needle.begin(), needles.short_needle.end());
    needle.feeds.push_back({0, P, false});
    for (size_t at = P; at < needle.tokens.size(); ++at) needle.feeds.push_back({at, 1, false});
  } else {
    needle.name = "the long needle";
    needle.tokens.assign(needles.long_needle.begin(), needles.long_needle.end());
    needle.feeds = feeds_of(shape, split(shape, needle.tokens.size(), S), all_positions, plan);
    needle.start_step = 1;
  }
  for (size_t f = 0; f < n_fillers; ++f) {
    Seq q;
    q.name = fmt::format("filler {}", f + 1);
    if (s == Schedule::kNeedleDecodes) {
      const size_t n = size_t(plan.filler_lengths[f % plan.filler_lengths.size()]);
      q.feeds = feeds_of(shape, split(shape, n, S), all_positions, plan);
    } else {
      q.feeds = decoding_filler(shape, S, all_positions, plan);
    }
    q.tokens = random_tokens(text, q.feeds.back().begin + q.feeds.back().n, n_vocab);
    cast.push_back(std::move(q));
  }
  return cast;
}

std::string Shape::label() const {
  return fmt::format("B={}, {}, needle in slot {}", batch, schedule_name(schedule), needle_slot);
}

size_t Shape::cast_at(int slot) const {
  if (slot == needle_slot) return 0;
  return size_t(slot < needle_slot ? slot + 1 : slot);
}

std::vector<Shape> batch_shapes(const ServingOptions& o) {
  std::vector<Shape> out;
  for (int b : o.plan.batch_sizes) {
    if (!o.runs_batch(b)) continue;
    for (Schedule s : {Schedule::kNeedleDecodes, Schedule::kNeedlePrefills})
      out.push_back({b, s, int(out.size()) % b});
  }
  return out;
}

}  // namespace touchstone::detail
