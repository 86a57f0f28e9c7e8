// touchstone::plan_passes (touchstone/abi/batch_plan.h): every token of every
// entry lands in exactly one pass row, in entry order, no pass holds more than
// max_rows rows, and the logits rows are exactly the ones each entry asks for.
#include "touchstone/abi/batch_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace touchstone {
namespace {

struct Entry {
  int32_t n;
  bool all_positions;
};

// Replays the plan token by token, checking each invariant on the way.
void check_plan(const std::vector<Entry>& e, int32_t max_rows) {
  const auto passes = plan_passes(std::span<const Entry>(e), max_rows);
  size_t entry = 0;
  int32_t next = 0;  // the next token expected of `entry`
  std::vector<int32_t> out_rows(e.size(), 0);
  for (const PlannedPass& p : passes) {
    ASSERT_GT(p.rows, 0);
    ASSERT_LE(p.rows, max_rows);
    int32_t row = 0, out = 0;
    for (const PassPiece& k : p.pieces) {
      ASSERT_EQ(k.entry, entry);
      ASSERT_EQ(k.offset, next);
      ASSERT_EQ(k.row0, row);
      ASSERT_EQ(k.out_row0, out);
      ASSERT_GT(k.n, 0);
      next += k.n;
      ASSERT_EQ(k.completes, next == e[entry].n);
      ASSERT_EQ(k.out_rows, e[entry].all_positions ? k.n : (k.completes ? 1 : 0));
      out_rows[entry] += k.out_rows;
      row += k.n;
      out += k.out_rows;
      if (k.completes) {
        ++entry;
        next = 0;
      }
    }
    ASSERT_EQ(p.rows, row);
    ASSERT_EQ(p.out_rows, out);
    // A pass ends only when it is full or the entries are done.
    if (&p != &passes.back()) {
      EXPECT_EQ(p.rows, max_rows);
    }
  }
  EXPECT_EQ(entry, e.size());
  for (size_t i = 0; i < e.size(); ++i)
    EXPECT_EQ(out_rows[i], e[i].all_positions ? e[i].n : 1) << "entry " << i;
}

TEST(BatchPlan, EveryTokenOnceInOrderWithinTheRowLimit) {
  check_plan({{1, false}}, 32);
  check_plan({{1, false}, {1, false}, {1, true}}, 1);
  check_plan({{40, true}, {3, false}, {1, false}, {70, false}}, 32);
  check_plan({{32, false}, {32, true}}, 32);
  check_plan({{5, true}, {5, true}, {5, true}}, 4);
  std::vector<Entry> many;
  for (int32_t i = 1; i <= 40; ++i) many.push_back({i % 7 + 1, i % 3 == 0});
  for (int32_t rows : {1, 2, 7, 32, 1000}) check_plan(many, rows);
}

TEST(BatchPlan, LongEntrySpansPassesAndShortOnesShareOne) {
  const std::vector<Entry> e = {{2, false}, {70, true}, {1, false}};
  const auto p = plan_passes(std::span<const Entry>(e), 32);
  ASSERT_EQ(p.size(), 3u);  // 2 + 30 | 32 | 8 + 1
  EXPECT_EQ(p[0].pieces.size(), 2u);
  EXPECT_EQ(p[0].pieces[1].n, 30);
  EXPECT_EQ(p[1].pieces.size(), 1u);
  EXPECT_EQ(p[1].pieces[0].offset, 30);
  EXPECT_EQ(p[2].pieces[0].n, 8);
  EXPECT_TRUE(p[2].pieces[0].completes);
  EXPECT_EQ(p[2].pieces[1].entry, 2u);
  EXPECT_EQ(p[2].out_rows, 9);
}

TEST(BatchPlan, NoEntriesNoPasses) {
  EXPECT_TRUE(plan_passes(std::span<const Entry>(), 32).empty());
}

}  // namespace
}  // namespace touchstone
