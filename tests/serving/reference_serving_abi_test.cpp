// The reference backend's ABI v6 serving members through the harness runtime
// (dlopen, touchstone::BackendAdapter's checks) on the tiny llama test model:
// the capabilities it declares, step_batch == each session's own prefill and
// fork_session == a fresh session bit for bit, a refused step_batch moves no
// session, and the serving faults are accepted.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

using Tokens = std::vector<int32_t>;
using Logits = std::vector<float>;

struct ReferenceServingAbi : ::testing::Test {
  std::shared_ptr<BackendLibrary> lib = BackendLibrary::load(REFERENCE_BACKEND_PATH);
  BackendModel model{lib, TINY_MODEL_PATH};

  std::unique_ptr<BackendSession> open(const std::string& fault = "") {
    BackendSessionOptions o;
    o.n_threads = 2;
    o.max_context = 64;
    o.fault = fault;
    return std::make_unique<BackendSession>(model, o);
  }
  size_t v() const { return size_t(model.n_vocab()); }
};

bool same_bits(const Logits& a, const Logits& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(ReferenceServingAbi, DeclaresALoopedBatchInvariantStepBatchAndANativeFork) {
  const ts_capabilities c = lib->capabilities();
  EXPECT_TRUE(c.flags & TS_CAP_BATCH_INVARIANT);
  EXPECT_EQ(c.batch_invariant_paths, 0u);  // every path
  EXPECT_TRUE(c.flags & TS_CAP_KV_PREFIX_COPY);
  EXPECT_FALSE(c.flags & TS_CAP_BATCHED_SESSIONS);
  EXPECT_EQ(lib->batch_mode(), BatchMode::kBackendLoop);
  EXPECT_TRUE(lib->has_fork());
}

TEST_F(ReferenceServingAbi, StepBatchIsEachSessionsOwnPrefill) {
  const std::vector<Tokens> history = {{1, 2, 3}, {7}, {4, 4, 9, 12, 30}};
  const std::vector<Tokens> steps = {{5}, {8, 2, 6}, {11}};
  std::vector<std::unique_ptr<BackendSession>> batched, alone;
  for (const Tokens& h : history) {
    batched.push_back(open());
    batched.back()->prefill(h);
    alone.push_back(open());
    alone.back()->prefill(h);
  }
  std::vector<Logits> out = {Logits(v()), Logits(3 * v()), Logits(v())};
  std::vector<BackendSession::Step> batch;
  for (size_t i = 0; i < steps.size(); ++i)
    batch.push_back({batched[i].get(), steps[i], i == 1, out[i]});
  BackendSession::step_batch(batch);
  EXPECT_TRUE(same_bits(out[0], alone[0]->prefill(steps[0])));
  EXPECT_TRUE(same_bits(out[1], alone[1]->prefill_all(steps[1])));
  EXPECT_TRUE(same_bits(out[2], alone[2]->prefill(steps[2])));
  for (size_t i = 0; i < steps.size(); ++i)
    EXPECT_EQ(batched[i]->position(), int32_t(history[i].size() + steps[i].size()));
}

TEST_F(ReferenceServingAbi, ARefusedStepBatchMovesNoSession) {
  auto a = open(), b = open();
  a->prefill(Tokens{1, 2});
  Logits la(v()), lb(v());
  const Tokens good = {3}, bad = {int32_t(v())};
  const BackendSession::Step batch[] = {{a.get(), good, false, la}, {b.get(), bad, false, lb}};
  EXPECT_THROW(BackendSession::step_batch(batch), Error);
  EXPECT_EQ(a->position(), 2);
  EXPECT_EQ(b->position(), 0);
}

TEST_F(ReferenceServingAbi, ForkIsAFreshSession) {
  auto src = open();
  src->prefill(Tokens{1, 7, 3, 30, 12, 5});
  auto forked = src->fork(4);
  ASSERT_TRUE(forked->fork_native());
  EXPECT_EQ(forked->position(), 4);
  auto fresh = open();
  fresh->prefill(Tokens{1, 7, 3, 30});
  EXPECT_TRUE(same_bits(forked->prefill_all(Tokens{9, 2}), fresh->prefill_all(Tokens{9, 2})));
  EXPECT_EQ(src->position(), 6);  // unchanged
}

TEST_F(ReferenceServingAbi, ServingFaultsAreAccepted) {
  for (const char* fault : {"batch_token_count_split", "batch_kv_leak", "fork_short_copy",
                            "batch_position_offset", "verify_row_shift"}) {
    EXPECT_NO_THROW(open(fault)) << fault;
  }
  // fork_short_copy through the ABI: the fork continues differently.
  auto src = open("fork_short_copy"), fresh = open();
  src->prefill(Tokens{1, 7, 3, 30});
  fresh->prefill(Tokens{1, 7, 3, 30});
  EXPECT_FALSE(same_bits(src->fork(4)->prefill(Tokens{2}), fresh->prefill(Tokens{2})));
}

}  // namespace
}  // namespace touchstone
