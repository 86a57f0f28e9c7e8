// touchstone/abi/batch_plan.h - how a backend splits one step_batch call (ABI v6,
// docs/contract.md#serving-abi-v6) into forward passes of a bounded number of
// rows: the entries' tokens, concatenated in entry order, fill passes of at
// most `max_rows` rows; an entry that does not fit in the room left continues
// in the next pass. Every native step_batch in the tree (cpu_simd, vulkan,
// cuda) plans with this, so they split a batch the same way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace touchstone {

// One entry's share of a pass: pass rows [row0, row0 + n) hold the entry's
// tokens [offset, offset + n). `completes` when they end the entry. Logits:
// `out_rows` rows (n when the entry wants every position, 1 for the piece
// that completes an entry wanting its last position only, else 0), at rows
// [out_row0, out_row0 + out_rows) of the pass's logits.
struct PassPiece {
  size_t entry = 0;
  int32_t offset = 0;
  int32_t n = 0;
  int32_t row0 = 0;
  bool completes = false;
  int32_t out_rows = 0;
  int32_t out_row0 = 0;
};

// One forward pass: its pieces in row order, its rows (<= max_rows) and its
// logits rows.
struct PlannedPass {
  std::vector<PassPiece> pieces;
  int32_t rows = 0;
  int32_t out_rows = 0;
};

// The passes of a batch. `Entry` has `n` (tokens, >= 1: the adapter refuses
// empty entries, TS_ERR_INVALID_ARG) and `all_positions` (logits for every
// token, else for the last), as each backend's BatchEntry does. max_rows >= 1.
// Pure: it reads only n and all_positions, so a backend builds each pass's
// own segments (positions, KV caches) just before running it.
template <class Entry>
std::vector<PlannedPass> plan_passes(std::span<const Entry> entries, int32_t max_rows) {
  std::vector<PlannedPass> passes;
  size_t i = 0;
  int32_t off = 0;  // tokens of entry i already planned
  while (i < entries.size()) {
    PlannedPass p;
    while (i < entries.size() && p.rows < max_rows) {
      const Entry& x = entries[i];
      PassPiece k;
      k.entry = i;
      k.offset = off;
      k.n = std::min(int32_t(x.n) - off, max_rows - p.rows);
      k.row0 = p.rows;
      k.completes = off + k.n == int32_t(x.n);
      k.out_rows = x.all_positions ? k.n : (k.completes ? 1 : 0);
      k.out_row0 = p.out_rows;
      p.rows += k.n;
      p.out_rows += k.out_rows;
      p.pieces.push_back(k);
      off = k.completes ? 0 : off + k.n;
      i += k.completes ? 1 : 0;
    }
    passes.push_back(std::move(p));
  }
  return passes;
}

}  // namespace touchstone
