// serving_plan_test.cpp - the named serving plans (touchstone/serving.h): each
// is smaller than the next, the smoke plan still has every kind of batch
// (needle + at least two fillers, prefill chunks longer than one token) and a
// draft length above 1, and an unknown name lists the known ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "touchstone/error.h"
#include "touchstone/serving.h"

namespace touchstone {
namespace {

int largest(const std::vector<int>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(ServingPlan, NamedPlansGrow) {
  const ServingPlan smoke = ServingPlan::named("smoke"), quick = ServingPlan::named("quick"),
                    full = ServingPlan::named("full");
  EXPECT_LE(largest(smoke.batch_sizes), largest(quick.batch_sizes));
  EXPECT_LT(largest(quick.batch_sizes), largest(full.batch_sizes));
  EXPECT_LE(smoke.filler_max, quick.filler_max);
  EXPECT_LT(quick.filler_max, full.filler_max);
  EXPECT_LE(smoke.decode_steps, quick.decode_steps);
  EXPECT_LT(smoke.context_needed(100), full.context_needed(100));
}

TEST(ServingPlan, SmokeStillMixesEveryKindOfEntry) {
  const ServingPlan p = ServingPlan::smoke();
  EXPECT_GE(largest(p.batch_sizes), 3);  // the needle and two fillers
  EXPECT_GT(p.filler_chunk_max, 1);      // filler prefill chunks beside decode steps
  EXPECT_GE(p.decode_steps, 4);
  EXPECT_GT(largest(p.draft_lengths), 1);  // a verify call with several drafts
}

TEST(ServingPlan, UnknownNameListsTheKnownOnes) {
  try {
    ServingPlan::named("huge");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("smoke, quick, full"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace touchstone
