// touchstone/harness/stale.h - is a golden still what the manifest asks for?
//
// A golden records, per case, the exact prompt text (after chat templating),
// the chat flag and n_predict greedy steps, and the model's sha256. Editing
// the manifest without re-recording would compare backends against answers
// to a different question; parity refuses that as a stale golden.
#pragma once

#include "touchstone/harness/chat.h"

#include <string>
#include <vector>

#include "touchstone/golden/golden.h"
#include "touchstone/golden/manifest.h"

namespace touchstone {

// One line per mismatch between `manifest` (model `model`, its cases and
// scoring passages) and the golden `g`; empty = fresh. Each line starts with
// "stale golden: " and names the case/passage and the field, e.g.
//   stale golden: case 'narrative': prompt differs from the manifest (first
//   difference at byte 5: golden "Once upon a time", manifest "Once upon a tide")
// Compared: model name and sha256, every manifest case of the model (present,
// prompt text as the recorder builds it, chat flag, n_predict = number of
// greedy steps), every scoring passage of the model (present, text).
// `chat` is the model's template (chat cases' prompt text is rendered with it).
// `only`: when given, just the cases and passages of these names (a run's
// selection: another case's template is then never rendered).
std::vector<std::string> stale_golden_reasons(const Manifest& manifest, const ManifestModel& model,
                                              const GoldenFile& g, const ChatTemplate& chat,
                                              const std::vector<std::string>* only = nullptr);

// Throws Error "<golden path>: stale golden ... re-record with `touchstone
// golden --manifest <manifest>`" listing every reason; no-op when fresh.
void require_fresh_golden(const Manifest& manifest, const ManifestModel& model, const GoldenFile& g,
                          const ChatTemplate& chat, const std::vector<std::string>* only = nullptr);

}  // namespace touchstone
