// serving_batch.cpp - serving.batch_invariance and serving.content_isolation
// (touchstone/harness/serving.h); the shapes: serving_batch_shape.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "row_compare.h"
#include "serving_batch.h"
#include "serving_internal.h"
#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone::detail {
namespace {

// Called with (slot, position, row) for every row a batch run returns.
using RowSink = std::function<void(size_t, int, std::span<const float>)>;

// The sequences of a shape, in slot order.
std::vector<const Seq*> in_slots(const Shape& s, const std::vector<Seq>& cast) {
  std::vector<const Seq*> seqs;
  for (int slot = 0; slot < s.batch; ++slot) seqs.push_back(&cast[s.cast_at(slot)]);
  return seqs;
}

// The layer taps of one entry: sequence `slot`'s feed number `feed`, at its
// last position (what a backend records per call). run_batch / run_alone
// stop once they have read them.
struct TapProbe {
  size_t slot = 0, feed = 0, n_floats = 0;
  std::vector<float> taps;
};

// The feed of q that returned the row at `pos`.
size_t feed_at(const Seq& q, int pos) {
  for (size_t k = 0; k < q.feeds.size(); ++k) {
    if (int(q.feeds[k].begin) <= pos && pos < int(q.feeds[k].begin + q.feeds[k].n)) return k;
  }
  throw Error("serving check: no feed holds a compared position (a harness bug)");
}

// Runs the sequences through BackendSession::step_batch, one feed of each active
// sequence per call, until every sequence is fed; each row goes to `sink`.
// With a probe: the probed entry's taps are read and the run stops there.
void run_batch(const BackendModel& m, const BackendSessionOptions& so,
               const std::vector<const Seq*>& seqs, const RowSink& sink,
               TapProbe* probe = nullptr) {
  const size_t V = size_t(m.n_vocab());
  std::vector<std::unique_ptr<BackendSession>> sessions;
  for (size_t i = 0; i < seqs.size(); ++i)
    sessions.push_back(std::make_unique<BackendSession>(m, so));
  std::vector<size_t> next(seqs.size(), 0);
  std::vector<Row> logits(seqs.size());
  for (int step = 0;; ++step) {
    std::vector<BackendSession::Step> steps;
    std::vector<size_t> fed;
    bool left = false;
    for (size_t i = 0; i < seqs.size(); ++i) {
      left = left || next[i] < seqs[i]->feeds.size();
      if (step < seqs[i]->start_step || next[i] >= seqs[i]->feeds.size()) continue;
      const Feed& f = seqs[i]->feeds[next[i]];
      if (probe && i == probe->slot && next[i] == probe->feed) sessions[i]->set_taps(true);
      logits[i].assign((f.all ? f.n : 1) * V, 0.0f);
      steps.push_back({sessions[i].get(),
                       std::span<const int32_t>(seqs[i]->tokens.data() + f.begin, f.n), f.all,
                       logits[i]});
      fed.push_back(i);
    }
    if (!left) return;
    if (steps.empty()) continue;
    BackendSession::step_batch(steps);
    if (probe && next[probe->slot] == probe->feed &&
        std::find(fed.begin(), fed.end(), probe->slot) != fed.end()) {
      probe->taps = sessions[probe->slot]->read_taps(probe->n_floats);
      return;
    }
    for (size_t i : fed) {
      const Feed& f = seqs[i]->feeds[next[i]++];
      const size_t rows = f.all ? f.n : 1;
      for (size_t r = 0; r < rows; ++r) {
        sink(i, int(f.begin + f.n - rows + r), std::span<const float>(logits[i].data() + r * V, V));
      }
    }
  }
}

// The sequence alone, fed the same way through prefill / decode / all-position
// prefill. With a probe: the probed feed's taps are read and the run stops there.
PositionedRows run_alone(const BackendModel& m, const BackendSessionOptions& so, const Seq& q,
                         TapProbe* probe = nullptr) {
  const size_t V = size_t(m.n_vocab());
  BackendSession s(m, so);
  PositionedRows out;
  for (size_t k = 0; k < q.feeds.size(); ++k) {
    if (probe && k == probe->feed + 1) {
      probe->taps = s.read_taps(probe->n_floats);
      return out;
    }
    if (probe && k == probe->feed) s.set_taps(true);
    const Feed& f = q.feeds[k];
    const std::span<const int32_t> t(q.tokens.data() + f.begin, f.n);
    if (f.all) {
      const std::vector<float> all = s.prefill_all(t);
      for (size_t r = 0; r < f.n; ++r) {
        out.rows.emplace_back(all.begin() + std::ptrdiff_t(r * V),
                              all.begin() + std::ptrdiff_t((r + 1) * V));
        out.positions.push_back(int(f.begin + r));
      }
      continue;
    }
    if (f.n == 1 && f.begin > 0) {
      out.rows.emplace_back(V);
      s.decode(t[0], out.rows.back());
    } else {
      out.rows.push_back(s.prefill(t));
    }
    out.positions.push_back(int(f.begin + f.n - 1));
  }
  if (probe) probe->taps = s.read_taps(probe->n_floats);
  return out;
}

double repeat_drift(const PositionedRows& a, const PositionedRows& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.rows.size(); ++i)
    d = std::max(d, row_diff(a.rows[i], b.rows[i]).max_abs);
  return d;
}

// The batch checks' shared state: the casts of both contents, the alone runs
// (one per cast member, computed when first needed, reused by every shape).
struct BatchRun {
  const BackendModel& model;
  const Profile& profile;
  const ServingOptions& opt;
  Needles needles;
  size_t n_fillers = 0;
  std::string mode;
  std::map<Schedule, std::vector<Seq>> x, y;
  std::map<Schedule, std::vector<std::optional<PositionedRows>>> alone;

  const std::vector<Seq>& cast(Schedule s, bool other_contents) {
    auto& m = other_contents ? y : x;
    auto it = m.find(s);
    if (it != m.end()) return it->second;
    const uint64_t content = other_contents ? opt.plan.seed * 7 + 2 : opt.plan.seed * 3 + 1;
    return m[s] = make_cast(s, needles, opt.plan, n_fillers, opt.all_positions, content,
                            model.n_vocab());
  }
  const PositionedRows& alone_rows(Schedule s, size_t member) {
    auto& v = alone[s];
    v.resize(n_fillers + 1);
    if (!v[member]) v[member] = run_alone(model, opt.session, cast(s, false)[member]);
    return *v[member];
  }
  // Runs the shape with the first contents: every entry compared with its
  // sequence alone into inv (when `judge`); returns the needle's rows.
  PositionedRows judged_run(const Shape& s, bool judge, CaseResult& inv, DriftMeter& meter);
  // The layer taps of the sequence at `slot` of shape s (contents y when
  // other_contents), in the batch or alone, at the last position of the
  // entry that returned the row at `pos`.
  std::vector<float> batch_taps(const Shape& s, bool other_contents, size_t slot, int pos);
  std::vector<float> alone_taps(const Shape& s, size_t slot, int pos);
};

std::vector<float> BatchRun::batch_taps(const Shape& s, bool other_contents, size_t slot, int pos) {
  const std::vector<const Seq*> seqs = in_slots(s, cast(s.schedule, other_contents));
  TapProbe probe{slot, feed_at(*seqs[slot], pos), opt.tap_floats, {}};
  run_batch(
      model, opt.session, seqs, [](size_t, int, std::span<const float>) {}, &probe);
  return probe.taps;
}

std::vector<float> BatchRun::alone_taps(const Shape& s, size_t slot, int pos) {
  const Seq& q = cast(s.schedule, false)[s.cast_at(int(slot))];
  TapProbe probe{0, feed_at(q, pos), opt.tap_floats, {}};
  run_alone(model, opt.session, q, &probe);
  return probe.taps;
}

// The last position of the entry of q that returned the row at `pos`.
int entry_end(const Seq& q, int pos) {
  const Feed& f = q.feeds[feed_at(q, pos)];
  return int(f.begin + f.n) - 1;
}

PositionedRows BatchRun::judged_run(const Shape& s, bool judge, CaseResult& inv,
                                    DriftMeter& meter) {
  const std::vector<const Seq*> seqs = in_slots(s, cast(s.schedule, false));
  std::vector<size_t> cursor(seqs.size(), 0);
  PositionedRows needle;
  const size_t needle_slot = size_t(s.needle_slot);
  std::optional<std::pair<size_t, int>> failed;  // this run's first failing (slot, position)
  const bool failed_before = inv.first_logit_violation_step >= 0;
  run_batch(model, opt.session, seqs, [&](size_t slot, int pos, std::span<const float> row) {
    if (slot == needle_slot) {
      needle.positions.push_back(pos);
      needle.rows.emplace_back(row.begin(), row.end());
    }
    if (!judge) return;
    const PositionedRows& want = alone_rows(s.schedule, s.cast_at(int(slot)));
    const size_t k = cursor[slot]++;
    if (k >= want.rows.size() || want.positions[k] != pos)
      throw Error("serving check: batch and alone rows at different positions (a harness bug)");
    const std::string where =
        fmt::format(" ({}; slot {}: {}; batching {})", s.label(), slot, seqs[slot]->name, mode);
    meter.add(want.rows[k], row);
    if (!compare_row(want.rows[k], row, pos, opt.batch_invariant, "TS_CAP_BATCH_INVARIANT", profile,
                     where, inv) &&
        !failed)
      failed = {slot, pos};
  });
  if (failed && !failed_before) {
    try_locate(inv, opt, [&] {
      const auto [slot, pos] = *failed;
      note_layers(inv, alone_taps(s, slot, pos), batch_taps(s, false, slot, pos), opt,
                  opt.batch_invariant, entry_end(*seqs[slot], pos),
                  fmt::format(" ({}; slot {}: {}; taps of the entry ending there, batch vs alone)",
                              s.label(), slot, seqs[slot]->name));
    });
  }
  return needle;
}

PositionedRows needle_rows(const BackendModel& m, const BackendSessionOptions& so, const Shape& s,
                           const std::vector<Seq>& cast) {
  PositionedRows out;
  run_batch(m, so, in_slots(s, cast), [&](size_t slot, int pos, std::span<const float> row) {
    if (slot != size_t(s.needle_slot)) return;
    out.positions.push_back(pos);
    out.rows.emplace_back(row.begin(), row.end());
  });
  return out;
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

// content_isolation without a bitwise claim, one shape: the needle's rows with
// contents x (in_x, already run) and y, and a repeat of each. The repeats set
// the noise allowance, so all four are first judged against the needle alone
// with the profile (NaN / Inf is a FAIL, never noise) into r.
IsolationRuns isolation_runs(BatchRun& run, const Shape& s, PositionedRows in_x,
                             const std::string& where, CaseResult& r) {
  const std::vector<Seq>& x = run.cast(s.schedule, false);
  const std::vector<Seq>& y = run.cast(s.schedule, true);
  PositionedRows in_y = needle_rows(run.model, run.opt.session, s, y);
  const PositionedRows rx = needle_rows(run.model, run.opt.session, s, x);
  const PositionedRows ry = needle_rows(run.model, run.opt.session, s, y);
  const PositionedRows& alone = run.alone_rows(s.schedule, s.cast_at(s.needle_slot));
  DriftMeter unused;
  const PositionedRows* runs[] = {&in_x, &in_y, &rx, &ry};
  for (const PositionedRows* one : runs) {
    compare_rows(alone, *one, false, "", run.profile,
                 where + " (a run that sets the noise allowance, against the needle alone)", r,
                 unused);
  }
  const double noise = std::max(repeat_drift(in_x, rx), repeat_drift(in_y, ry));
  return {{s.label(), s.batch}, where, std::move(in_x), std::move(in_y), noise};
}

}  // namespace

std::vector<CaseResult> check_batches(const BackendModel& model, const Needles& needles,
                                      const Profile& profile, const ServingOptions& opt) {
  CaseResult inv, iso;
  inv.name = "serving.batch_invariance";
  iso.name = "serving.content_isolation";
  const bool invariance = opt.runs(inv.name), isolation = opt.runs(iso.name);
  const std::vector<Shape> shapes = batch_shapes(opt);
  int most = 1;
  for (const Shape& s : shapes) most = std::max(most, s.batch);
  BatchRun run{model,
               profile,
               opt,
               needles,
               size_t(most - 1),
               batch_mode_name(model.library()->batch_mode()),
               {},
               {},
               {}};
  std::vector<IsolationRuns> noisy;  // content_isolation without a bitwise claim
  for (const Shape& s : shapes) {
    const std::string where = fmt::format(" ({}; batching {})", s.label(), run.mode);
    const auto t0 = std::chrono::steady_clock::now();
    DriftMeter m{{s.label(), s.batch}};
    PositionedRows in_x = run.judged_run(s, invariance, inv, m);
    if (invariance) inv.drift.push_back(m.point);
    const auto t1 = std::chrono::steady_clock::now();
    inv.seconds += std::chrono::duration<double>(t1 - t0).count();
    if (!isolation || s.batch != most) continue;  // the most company: the largest B

    if (opt.bitwise) {
      const PositionedRows in_y = needle_rows(model, opt.session, s, run.cast(s.schedule, true));
      DriftMeter mi{{s.label(), s.batch}};
      compare_rows(in_x, in_y, true,
                   "TS_CAP_BITWISE_DETERMINISM (other sequences' contents changed this one)",
                   profile, where, iso, mi);
      if (iso.first_logit_violation_step >= 0) {
        try_locate(iso, opt, [&] {
          const size_t slot = size_t(s.needle_slot);
          const int pos = iso.first_logit_violation_step;
          const Seq& q = run.cast(s.schedule, false)[s.cast_at(s.needle_slot)];
          note_layers(iso, run.batch_taps(s, false, slot, pos), run.batch_taps(s, true, slot, pos),
                      opt, true, entry_end(q, pos),
                      fmt::format(" ({}; the needle's taps with both filler contents)", s.label()));
        });
      }
      iso.drift.push_back(mi.point);
    } else {
      noisy.push_back(isolation_runs(run, s, std::move(in_x), where, iso));
    }
    iso.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  if (!noisy.empty()) judge_isolation(noisy, profile, iso);
  finish_rows(inv, "a sequence's logits depend on its batch");
  finish_rows(iso, "another sequence's content reaches the needle");
  std::vector<CaseResult> out;
  if (invariance) out.push_back(std::move(inv));
  if (isolation) out.push_back(std::move(iso));
  return out;
}

}  // namespace touchstone::detail
