// multimodal_split.cpp - multimodal.consistency (touchstone/harness/multimodal.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "row_compare.h"
#include "touchstone/common/error.h"
#include "touchstone/harness/multimodal.h"
#include "touchstone/harness/recorder.h"

namespace touchstone {
namespace {

using Rows = std::vector<std::vector<float>>;

// The case's prompt with each frame's rows in calls of at most `chunk` rows (0: the
// whole frame in one call), then n decodes of its golden continuation: the row at each
// frame's end, the prompt's end, and each decode.
Rows split_rows(const BackendModel& model, const BackendSessionOptions& so, const GoldenCase& g,
                int32_t chunk, int n) {
  BackendSession s(model, so);
  Rows out;
  std::vector<float> last = prefill_case_prompt(s, g, chunk, &out);
  out.push_back(std::move(last));
  for (int i = 0; i < n; ++i) {
    out.emplace_back(size_t(s.n_vocab()));
    s.decode(g.greedy_ids[size_t(i)], out.back());
  }
  return out;
}

// The sequence position of each row split_rows returns.
std::vector<int> row_positions(const GoldenCase& g, int n) {
  std::vector<int> pos;
  int f = 0;
  for (const int32_t at : g.frame_positions()) pos.push_back(at + (++f) * g.frame_rows() - 1);
  const int last = int(g.prompt_ids.size()) + g.image_tokens - 1;
  for (int i = 0; i <= n; ++i) pos.push_back(last + i);
  return pos;
}

}  // namespace

CaseResult check_image_split(const BackendModel& model, const GoldenCase& g, const Profile& p,
                             const BackendSessionOptions& so, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!g.has_image() || g.image_bidirectional != 0)
    throw Error("multimodal.consistency: case '{}' has no image attended causally", g.name);
  CaseResult r;
  r.name = "multimodal.consistency";
  const int n = std::min(steps, int(g.greedy_ids.size()));
  const Rows want = split_rows(model, so, g, 0, n);
  const std::vector<int> pos = row_positions(g, n);
  for (const int32_t chunk : {1, 3, 7}) {
    if (chunk >= g.frame_rows()) continue;
    const Rows got = split_rows(model, so, g, chunk, n);
    const std::string where =
        fmt::format(" (case '{}', each frame in calls of {} rows)", g.name, chunk);
    for (size_t i = 0; i < want.size(); ++i)
      if (!detail::compare_row(want[i], got[i], pos[i], false, "", p, where, r)) break;
  }
  r.n_total = r.n_steps;
  detail::finish_rows(r, "multimodal.consistency: an image split across prefill calls differs");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace touchstone
