// serving_plan_test.cpp - the named serving plans (touchstone/harness/serving.h): each
// is smaller than the next, the smoke plan still has every kind of batch
// (needle + at least two fillers, all-position entries) and a draft length
// above 1, sequences cross page and tile boundaries, and an unknown name lists
// the known ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "touchstone/common/error.h"
#include "touchstone/harness/serving.h"

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
  EXPECT_GE(p.verify_max, 3);            // all-position entries verifying 2 drafts or more
  EXPECT_GE(p.decode_steps, 4);
  EXPECT_GT(largest(p.draft_lengths), 1);  // a verify call with several drafts
  EXPECT_GT(p.needle_length, 64);          // crosses the 32-token page and the 64-token one
}

// The quick plan's sequences cross 16, 32, 64, 128 and 256 positions; the full
// plan's go past 2,048 and are fed in chunks over 128 tokens.
TEST(ServingPlan, SequencesCrossPageAndTileBoundaries) {
  const ServingPlan quick = ServingPlan::quick(), full = ServingPlan::full();
  EXPECT_GT(quick.needle_length, 256);
  EXPECT_GT(full.needle_length, 2048);
  EXPECT_GT(full.needle_length / (full.decode_steps + 1), 64);  // mean chunk
  for (const ServingPlan* p : {&quick, &full}) {
    EXPECT_GE(p->context_needed(20), p->needle_length);
    for (int32_t l : p->filler_lengths) EXPECT_GE(p->context_needed(20), l);
    EXPECT_GE(p->context_needed(20), p->filler_max + (p->decode_steps + 1) * p->verify_max);
  }
}

// A bitwise claim withdrawn across forks (TS_CAP_BITWISE_NOT_ACROSS_FORKS, issue
// 37) leaves it everywhere else; the flag means nothing without the claim.
TEST(ServingOptions, BitwiseClaimCanStopAtForks) {
  ts_capabilities caps{};
  caps.flags = TS_CAP_BITWISE_DETERMINISM;
  ServingOptions o = serving_options(caps, BackendSessionOptions{}, ServingPlan::quick());
  EXPECT_TRUE(o.bitwise);
  EXPECT_TRUE(o.fork_bitwise);
  caps.flags |= TS_CAP_BITWISE_NOT_ACROSS_FORKS;
  o = serving_options(caps, BackendSessionOptions{}, ServingPlan::quick());
  EXPECT_TRUE(o.bitwise);
  EXPECT_FALSE(o.fork_bitwise);
  caps.flags = TS_CAP_BITWISE_NOT_ACROSS_FORKS;
  o = serving_options(caps, BackendSessionOptions{}, ServingPlan::quick());
  EXPECT_FALSE(o.bitwise);
  EXPECT_FALSE(o.fork_bitwise);
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
