// touchstone/harness/known_divergence.h - reviewed, expected failures.
//
// A backend that is not ours (llama.cpp, a server) can fail a case for a
// documented reason (int8 activations, an fp16 GELU table). Thresholds are never
// loosened for it; instead a person writes a known_divergence entry with the
// numbers they measured and the bound they accept, and the harness turns a
// failure into the verdict KNOWN_DIVERGENCE only when:
//   - an entry names this backend, model, weight path, profile and item;
//   - every violated criterion of the result (CaseResult::violations) is a
//     check the entry lists, and this run's value is within the entry's accept
//     bound (<= accept; >= accept for top1_agreement and greedy);
//   - nothing else failed: a backend error, non-finite logits or a device-greedy
//     mismatch is never covered.
// An entry whose item now PASSES makes the result FAIL ("no longer reproduces:
// remove the entry"), so the list cannot go stale. Format: docs/known-divergences.md.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "touchstone/harness/parity.h"

namespace touchstone {

struct KnownDivergence {
  struct Bound {
    double measured = 0.0;  // the value the reviewer saw
    double accept = 0.0;    // the worst value still accepted
  };
  std::string id, backend, model, weights, profile, item;
  std::string why, measured_on, reviewed_by;
  std::map<std::string, Bound> checks;  // by Violation::check name
  std::string source;                   // "<file>, entry <i>"
};

// Which run the results come from.
struct KnownDivergenceKey {
  std::string backend, model, weights, profile;
};

class KnownDivergences {
 public:
  // Reads one file (format "touchstone-known-divergences", version 1). Throws
  // touchstone::Error naming the file, the entry index and the field for any
  // malformed, unknown or inconsistent content (e.g. accept looser than allowed,
  // an uncoverable check, an empty reviewed_by, two entries for one item).
  void load(const std::string& path);
  const std::vector<KnownDivergence>& entries() const { return entries_; }
  const KnownDivergence* find(const KnownDivergenceKey& key, const std::string& item) const;

  // Applies the matching entry (if any) to one result, as described above:
  // sets known_divergence, or adds a failure line (and a "known_divergence"
  // violation) saying why the entry does not apply.
  void apply(const KnownDivergenceKey& key, CaseResult& r) const;
  void apply(const KnownDivergenceKey& key, ScoringResult& r) const;
  // A golden-free check's row run on one case (the structured checks): the
  // entry for "<r.name>@<case_name>" when there is one, else the one for r.name.
  void apply(const KnownDivergenceKey& key, CaseResult& r, const std::string& case_name) const;

  // The checks an entry may list: the profile criteria of Violation::check.
  static bool coverable(const std::string& check);
  // True for the checks where higher is better (accept is a lower bound).
  static bool lower_bound(const std::string& check);

 private:
  std::vector<KnownDivergence> entries_;
};

}  // namespace touchstone
