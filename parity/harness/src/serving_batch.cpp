// serving_batch.cpp - serving.batch_invariance and serving.content_isolation
// (touchstone/serving.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "row_compare.h"
#include "serving_internal.h"
#include "touchstone/metrics.h"

namespace touchstone::detail {
namespace {

enum class Schedule { kNeedleDecodes, kNeedlePrefills };

const char* schedule_name(Schedule s) {
  return s == Schedule::kNeedleDecodes ? "fillers prefill while the needle decodes"
                                       : "the needle prefills while the fillers decode";
}

// A run of tokens fed in one entry.
struct Feed {
  size_t begin = 0, n = 0;
};

// One sequence of a batch: its tokens and how they are fed, from `start_step` on.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<Feed> feeds;
  int start_step = 0;
};

// The shape of one batch run (everything but the fillers' token contents).
struct Shape {
  int batch = 0;
  Schedule schedule = Schedule::kNeedleDecodes;
  int needle_slot = 0;
  std::vector<Feed> needle_feeds;
  std::vector<std::vector<size_t>> filler_chunks;  // per filler: its prompt's chunk sizes
  std::string label() const {
    return fmt::format("B={}, {}, needle in slot {}", batch, schedule_name(schedule), needle_slot);
  }
};

// Splits n tokens into chunks of 1..max_chunk (seeded).
std::vector<size_t> chunks_of(std::mt19937_64& rng, size_t n, size_t max_chunk) {
  std::vector<size_t> c;
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(n - done, std::uniform_int_distribution<size_t>(1, max_chunk)(rng));
    c.push_back(k);
    done += k;
  }
  return c;
}

Shape make_shape(int batch, Schedule sched, size_t needle_len, size_t prompt_len,
                 const ServingPlan& plan) {
  std::mt19937_64 rng(plan.seed ^ (uint64_t(batch) << 8) ^ uint64_t(sched));
  Shape s;
  s.batch = batch;
  s.schedule = sched;
  // Needle-decodes: never slot 0, so a bug that spares the first entry shows.
  s.needle_slot = sched == Schedule::kNeedleDecodes
                      ? std::uniform_int_distribution<int>(1, batch - 1)(rng)
                      : std::uniform_int_distribution<int>(0, batch - 1)(rng);
  std::vector<size_t> prompt_chunks = {prompt_len};
  if (sched == Schedule::kNeedlePrefills)
    prompt_chunks = chunks_of(rng, prompt_len, std::max<size_t>(1, (prompt_len + 2) / 3));
  size_t at = 0;
  for (size_t c : prompt_chunks) s.needle_feeds.push_back({at, c}), at += c;
  for (; at < needle_len; ++at) s.needle_feeds.push_back({at, 1});
  std::uniform_int_distribution<int32_t> len(plan.filler_min, plan.filler_max);
  for (int f = 0; f + 1 < batch; ++f) {
    const size_t n = size_t(len(rng));
    s.filler_chunks.push_back(sched == Schedule::kNeedleDecodes
                                  ? chunks_of(rng, n, size_t(plan.filler_chunk_max))
                                  : std::vector<size_t>{n});
  }
  return s;
}

// The sequences of a shape in slot order, fillers' tokens drawn from `content`.
std::vector<Seq> make_batch(const Shape& s, std::span<const int32_t> needle, uint64_t content,
                            int32_t n_vocab) {
  std::mt19937_64 rng(content);
  std::vector<Seq> seqs;
  size_t f = 0;
  for (int slot = 0; slot < s.batch; ++slot) {
    Seq q;
    if (slot == s.needle_slot) {
      q.tokens.assign(needle.begin(), needle.end());
      q.feeds = s.needle_feeds;
      q.start_step = s.schedule == Schedule::kNeedlePrefills ? 1 : 0;
    } else {
      const std::vector<size_t>& chunks = s.filler_chunks[f++];
      size_t at = 0;
      for (size_t c : chunks) q.feeds.push_back({at, c}), at += c;
      // One decode token per needle step after its prompt: it stays in every step.
      for (size_t i = 0; i <= s.needle_feeds.size(); ++i, ++at) q.feeds.push_back({at, 1});
      q.tokens = random_tokens(rng, at, n_vocab);
    }
    seqs.push_back(std::move(q));
  }
  return seqs;
}

// Runs the batch through Session::step_batch; returns the needle's rows.
PositionedRows run_batch(const Model& m, const SessionOptions& so, const std::vector<Seq>& seqs,
                         int needle_slot) {
  const size_t V = size_t(m.n_vocab());
  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t i = 0; i < seqs.size(); ++i) sessions.push_back(std::make_unique<Session>(m, so));
  std::vector<size_t> next(seqs.size(), 0);
  std::vector<Row> logits(seqs.size(), Row(V));
  PositionedRows out;
  const Seq& needle = seqs[size_t(needle_slot)];
  for (int step = 0; next[size_t(needle_slot)] < needle.feeds.size(); ++step) {
    std::vector<Session::Step> steps;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (step < seqs[i].start_step || next[i] >= seqs[i].feeds.size()) continue;
      const Feed& f = seqs[i].feeds[next[i]++];
      steps.push_back({sessions[i].get(),
                       std::span<const int32_t>(seqs[i].tokens.data() + f.begin, f.n), false,
                       logits[i]});
    }
    Session::step_batch(steps);
    if (step >= needle.start_step) {
      const Feed& f = needle.feeds[next[size_t(needle_slot)] - 1];
      out.positions.push_back(int(f.begin + f.n - 1));
      out.rows.push_back(logits[size_t(needle_slot)]);
    }
  }
  return out;
}

// The needle alone, fed the same way through prefill / decode.
PositionedRows run_alone(const Model& m, const SessionOptions& so, const Seq& needle) {
  Session s(m, so);
  PositionedRows out;
  for (const Feed& f : needle.feeds) {
    const std::span<const int32_t> t(needle.tokens.data() + f.begin, f.n);
    if (f.n == 1 && f.begin > 0) {
      out.rows.emplace_back(size_t(m.n_vocab()));
      s.decode(t[0], out.rows.back());
    } else {
      out.rows.push_back(s.prefill(t));
    }
    out.positions.push_back(int(f.begin + f.n - 1));
  }
  return out;
}

// The batch configurations of the plan (batch sizes over max_batch left out).
std::vector<Shape> shapes(const ServingOptions& o, size_t needle_len, size_t prompt_len) {
  std::vector<Shape> out;
  for (int b : o.plan.batch_sizes) {
    if (!o.runs_batch(b)) continue;
    for (Schedule s : {Schedule::kNeedleDecodes, Schedule::kNeedlePrefills})
      out.push_back(make_shape(b, s, needle_len, prompt_len, o.plan));
  }
  return out;
}

double repeat_drift(const PositionedRows& a, const PositionedRows& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.rows.size(); ++i)
    d = std::max(d, row_diff(a.rows[i], b.rows[i]).max_abs);
  return d;
}

}  // namespace

void judge_isolation(const std::vector<IsolationRuns>& runs, const Profile& profile,
                     CaseResult& r) {
  double noise = 0.0;
  for (const IsolationRuns& s : runs) noise = std::max(noise, s.noise);
  const double cap = profile.logits_max_abs_max.value_or(HUGE_VAL);
  const double allowed = std::min(4.0 * noise, cap);
  for (const IsolationRuns& s : runs) {
    DriftMeter meter{s.point};
    for (size_t i = 0; i < s.x.rows.size(); ++i) {
      meter.add(s.x.rows[i], s.y.rows[i]);
      ++r.n_steps;
      r.n_total = r.n_steps;
      const RowDiff rd = row_diff(s.x.rows[i], s.y.rows[i]);
      const double d = rd.max_abs;
      r.max_abs = std::max(r.max_abs, d);
      r.nmse_max = std::max(r.nmse_max, rd.nmse);
      if (d <= allowed && rd.non_finite == 0) {
        ++r.n_matched;
        continue;
      }
      if (rd.non_finite != 0) {
        note_violation(r, "non_finite", double(rd.non_finite), 0.0);
      } else {
        note_violation(r, "isolation_max_abs", d, allowed);
      }
      if (r.first_logit_violation_step < 0) {
        r.first_logit_violation_step = s.x.positions[i];
        r.first_logit_violation = fmt::format(
            "max |diff| {:.3g} with other filler contents > {:.3g} (4 x {:.3g}, the largest "
            "drift between two identical runs, at most the profile's logits_max_abs_max){}",
            d, allowed, noise, s.where);
      }
    }
    r.drift.push_back(meter.point);
  }
}

namespace {

// content_isolation without a bitwise claim, one shape: the runs with contents x
// and y and a repeat of each. The repeats set the noise allowance, so all four
// are first judged against the needle `alone` with the profile (NaN / Inf is a
// FAIL, never noise) into r.
IsolationRuns isolation_runs(const Model& m, const ServingOptions& opt, const Shape& s,
                             const std::vector<Seq>& x, const std::vector<Seq>& y,
                             PositionedRows in_x, const PositionedRows& alone,
                             const Profile& profile, const std::string& where, CaseResult& r) {
  PositionedRows in_y = run_batch(m, opt.session, y, s.needle_slot);
  const PositionedRows rx = run_batch(m, opt.session, x, s.needle_slot);
  const PositionedRows ry = run_batch(m, opt.session, y, s.needle_slot);
  DriftMeter unused;
  const PositionedRows* runs[] = {&in_x, &in_y, &rx, &ry};
  for (const PositionedRows* run : runs) {
    compare_rows(alone, *run, false, "", profile,
                 where + " (a run that sets the noise allowance, against the needle alone)", r,
                 unused);
  }
  const double noise = std::max(repeat_drift(in_x, rx), repeat_drift(in_y, ry));
  return {{s.label(), s.batch}, where, std::move(in_x), std::move(in_y), noise};
}

}  // namespace

std::vector<CaseResult> check_batches(const Model& model, std::span<const int32_t> needle,
                                      size_t prompt_len, const Profile& profile,
                                      const ServingOptions& opt) {
  const std::string mode = batch_mode_name(model.library()->batch_mode());
  CaseResult inv, iso;
  inv.name = "serving.batch_invariance";
  iso.name = "serving.content_isolation";
  const uint64_t content_x = opt.plan.seed * 3 + 1, content_y = opt.plan.seed * 7 + 2;
  const bool invariance = opt.runs(inv.name), isolation = opt.runs(iso.name);
  std::vector<IsolationRuns> noisy;  // content_isolation without a bitwise claim
  for (const Shape& s : shapes(opt, needle.size(), prompt_len)) {
    const std::string where = fmt::format(" ({}; batching {})", s.label(), mode);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Seq> x = make_batch(s, needle, content_x, model.n_vocab());
    PositionedRows in_x = run_batch(model, opt.session, x, s.needle_slot);
    PositionedRows alone;
    if (invariance || (isolation && !opt.bitwise))
      alone = run_alone(model, opt.session, x[size_t(s.needle_slot)]);
    if (invariance) {
      DriftMeter m{{s.label(), s.batch}};
      compare_rows(alone, in_x, opt.batch_invariant, "TS_CAP_BATCH_INVARIANT", profile, where, inv,
                   m);
      inv.drift.push_back(m.point);
    }
    const auto t1 = std::chrono::steady_clock::now();
    inv.seconds += std::chrono::duration<double>(t1 - t0).count();
    if (!isolation) continue;

    const std::vector<Seq> y = make_batch(s, needle, content_y, model.n_vocab());
    if (opt.bitwise) {
      const PositionedRows in_y = run_batch(model, opt.session, y, s.needle_slot);
      DriftMeter mi{{s.label(), s.batch}};
      compare_rows(in_x, in_y, true,
                   "TS_CAP_BITWISE_DETERMINISM (other sequences' contents changed this one)",
                   profile, where, iso, mi);
      iso.drift.push_back(mi.point);
    } else {
      noisy.push_back(
          isolation_runs(model, opt, s, x, y, std::move(in_x), alone, profile, where, iso));
    }
    iso.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  if (!noisy.empty()) judge_isolation(noisy, profile, iso);
  finish_rows(inv, "the needle's logits depend on its batch");
  finish_rows(iso, "another sequence's content reaches the needle");
  std::vector<CaseResult> out;
  if (invariance) out.push_back(std::move(inv));
  if (isolation) out.push_back(std::move(iso));
  return out;
}

}  // namespace touchstone::detail
