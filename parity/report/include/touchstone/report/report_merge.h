// touchstone/report/report_merge.h - the JSON reports of a plan's shards
// (`touchstone parity --shard I/N --json F`, touchstone/run/shard.h) put back
// together into the report an unsharded run of the same plan writes
// (docs/fleet.md#merge).
//
// Every input must be one shard of the same plan: its "shard" block names the
// plan digest, the goldens digest, the shard count, the plan's items and its
// own. The merged report has the rows of every item in plan order, the
// verdict order of docs/report-format.md applied to them, and a "shards" array
// (index, host, device, items, verdict, seconds) instead of "shard".
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace touchstone {

struct MergedReport {
  std::string json;  // the merged report (docs/report-format.md, plus "shards")
  std::string verdict;
  // Why the plan is not complete: a missing shard, a shard's unfinished run
  // (verdict INCOMPLETE, never PASS). Empty when every shard finished.
  std::vector<std::string> missing;
};

// sources: (name, text) of each shard's JSON report, any order. Throws
// touchstone::Error naming the source and field for input that cannot be
// merged: not JSON (with the byte offset), no "shard" block or a field of the
// wrong type, another plan or other goldens than the first source's (naming
// both digests), a count that differs, an index outside 0..N-1, two sources
// with the same index, two sources claiming the same item, an item outside the
// plan.
// The plan item (touchstone/run/shard.h) a report row belongs to: "case:NAME",
// "scoring:NAME" (scoring = a passage's row), "consistency", "serving" or
// "structured"; "" for rows of no item (a top-N backend's identity check, a
// backend failure).
std::string plan_item_of(const std::string& row_name, bool scoring);

MergedReport merge_shard_reports(const std::vector<std::pair<std::string, std::string>>& sources);

}  // namespace touchstone
