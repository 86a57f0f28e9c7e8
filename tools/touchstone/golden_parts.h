// golden_parts.h - a model's goldens recorded in parts (by case, on several hosts or
// processes) and assembled into one file: `touchstone golden --only ... --part FILE`
// writes the items recorded now, `touchstone golden --merge FILE...` assembles them.
#pragma once

#include <string>
#include <vector>

#include "touchstone/golden/golden.h"

namespace touchstone::cli {

// The golden of the manifest model the parts name, its items taken from the part files
// in manifest order. Every part must be a valid golden (header checked) of that model
// (its name and sha256) recorded by one and the same reference version and revision;
// every case and scoring passage of the model must be in exactly one part, and a part
// may hold nothing else. Throws touchstone::Error naming the file and the item or field.
// *mm_out: the manifest model the result belongs to.
GoldenFile merge_golden_parts(const Manifest& m, const std::vector<std::string>& parts,
                              const ManifestModel** mm_out);

}  // namespace touchstone::cli
