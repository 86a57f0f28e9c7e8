// ABI v6 step_batch and fork_session end to end, on a toy backend
// (toy_serving_backend.cpp), in process and through touchstone-backend-runner:
// every entry gets its own prefill's logits, errors name the entry and change
// no position, a fork continues like a fresh session, and a backend that writes
// past one entry's buffer is caught as a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

std::string toy(const char* variant) {
  return std::string(TOY_BACKEND_DIR) + "/libtoy_serving_" + variant + ".so";
}

std::shared_ptr<BackendLibrary> open(bool child, const char* variant = "ok") {
  return child ? BackendLibrary::spawn(toy(variant), ChildOptions{})
               : BackendLibrary::load(toy(variant));
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Serving : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    lib_ = open(GetParam());
    model_ = std::make_unique<BackendModel>(lib_, "toy.gguf");
  }
  std::shared_ptr<BackendLibrary> lib_;
  std::unique_ptr<BackendModel> model_;
  const std::vector<int32_t> prompt_ = {1, 2, 3, 4, 5, 6, 7};
};

TEST_P(Serving, InfoAndCapabilities) {
  EXPECT_TRUE(lib_->channel().info().step_batch);
  EXPECT_TRUE(lib_->has_fork());
  EXPECT_EQ(lib_->batch_mode(), BatchMode::kNative);
  const ts_capabilities c = lib_->capabilities();
  EXPECT_EQ(c.max_batch, 4);
  EXPECT_NE(c.flags & TS_CAP_BATCH_INVARIANT, 0u);
  EXPECT_NE(c.flags & TS_CAP_KV_PREFIX_COPY, 0u);  // set by the adapter: fork() exists
}

TEST_P(Serving, EachEntryGetsItsOwnPrefillsLogits) {
  BackendSession a(*model_, {}), b(*model_, {}), c(*model_, {});
  a.prefill(std::span<const int32_t>(prompt_.data(), 4));
  b.prefill(std::span<const int32_t>(prompt_.data(), 2));
  const std::vector<int32_t> ta = {9}, tb = {3, 4, 5, 6, 7}, tc = {8, 9, 10};
  const size_t V = size_t(model_->n_vocab());
  std::vector<float> la(V), lb(V), lc(3 * V);
  const std::vector<BackendSession::Step> steps = {
      {&a, ta, false, la}, {&b, tb, false, lb}, {&c, tc, true, lc}};
  BackendSession::step_batch(steps);
  EXPECT_EQ(a.position(), 5);
  EXPECT_EQ(b.position(), 7);
  EXPECT_EQ(c.position(), 3);
  BackendSession ra(*model_, {}), rb(*model_, {}), rc(*model_, {});
  ra.prefill(std::span<const int32_t>(prompt_.data(), 4));
  EXPECT_TRUE(same(la, ra.prefill(ta))) << "decode entry";
  rb.prefill(std::span<const int32_t>(prompt_.data(), 2));
  EXPECT_TRUE(same(lb, rb.prefill(tb))) << "prefill chunk entry";
  EXPECT_TRUE(same(lc, rc.prefill_all(tc))) << "all-positions entry";
}

TEST_P(Serving, ErrorsNameTheEntryAndMoveNoSession) {
  BackendSession a(*model_, {}), b(*model_, {});
  a.prefill(std::span<const int32_t>(prompt_.data(), 3));
  const size_t V = size_t(model_->n_vocab());
  std::vector<float> la(V), lb(V);
  const std::vector<int32_t> ok = {1}, bad = {1, 16};
  const std::vector<BackendSession::Step> steps = {{&a, ok, false, la}, {&b, bad, false, lb}};
  try {
    BackendSession::step_batch(steps);
    ADD_FAILURE() << "a bad token was accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("entry 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.position(), 3);
  EXPECT_EQ(b.position(), 0);
  // More entries than max_batch (4).
  std::vector<std::unique_ptr<BackendSession>> s;
  std::vector<std::vector<float>> out(5, std::vector<float>(V));
  std::vector<BackendSession::Step> five;
  for (int i = 0; i < 5; ++i) {
    s.push_back(std::make_unique<BackendSession>(*model_, BackendSessionOptions{}));
    five.push_back({s.back().get(), ok, false, out[size_t(i)]});
  }
  EXPECT_THROW(BackendSession::step_batch(five), BackendError);
  for (const auto& x : s) EXPECT_EQ(x->position(), 0);
}

TEST_P(Serving, ForkContinuesLikeAFreshSessionAndLeavesTheSource) {
  BackendSession src(*model_, {});
  src.prefill(prompt_);
  auto f = src.fork(4);
  EXPECT_EQ(f->position(), 4);
  EXPECT_EQ(src.position(), 7);
  const std::vector<int32_t> cont = {11, 12};
  BackendSession fresh(*model_, {});
  fresh.prefill(std::span<const int32_t>(prompt_.data(), 4));
  EXPECT_TRUE(same(f->prefill(cont), fresh.prefill(cont)));
  BackendSession again(*model_, {});
  again.prefill(prompt_);
  EXPECT_TRUE(same(src.prefill(cont), again.prefill(cont))) << "the source changed";
  EXPECT_THROW(src.fork(10), Error);
  if (GetParam()) {  // the runner checks handles (in process a handle is a pointer)
    EXPECT_THROW(lib_->channel().fork_session(0xdead, 0), BackendError) << "unknown handle";
  }
  auto empty = src.fork(0);
  EXPECT_EQ(empty->position(), 0);
}

INSTANTIATE_TEST_SUITE_P(Channels, Serving, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "child" : "in_process"; });

// The runner guards every entry's buffer with its own sentinel tail.
TEST(ServingChild, WritingPastOneEntrysBufferIsACrash) {
  auto lib = open(true, "overrun");
  BackendModel m(lib, "toy.gguf");
  BackendSession a(m, {}), b(m, {});
  const std::vector<int32_t> t = {1};
  std::vector<float> la(size_t(m.n_vocab())), lb(size_t(m.n_vocab()));
  const std::vector<BackendSession::Step> steps = {{&a, t, false, la}, {&b, t, false, lb}};
  try {
    BackendSession::step_batch(steps);
    ADD_FAILURE() << "the overrun went unnoticed";
  } catch (const BackendCrash& e) {
    EXPECT_NE(std::string(e.what()).find("step_batch (entry 1) wrote past the end"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(lib->channel().alive());
}

// The adapter rolls every session back when the backend's step_batch throws.
TEST(ServingChild, AFailedBatchLeavesEveryPosition) {
  for (bool child : {false, true}) {
    auto lib = open(child, "throw");
    BackendModel m(lib, "toy.gguf");
    BackendSession a(m, {}), b(m, {});
    a.prefill(std::vector<int32_t>{1, 2});
    const std::vector<int32_t> t = {3, 4};
    std::vector<float> la(size_t(m.n_vocab())), lb(size_t(m.n_vocab()));
    const std::vector<BackendSession::Step> steps = {{&a, t, false, la}, {&b, t, false, lb}};
    EXPECT_THROW(BackendSession::step_batch(steps), BackendError);
    EXPECT_EQ(a.position(), 2) << (child ? "child" : "in process");
    EXPECT_EQ(b.position(), 0) << (child ? "child" : "in process");
    EXPECT_TRUE(lib->channel().alive());
  }
}

}  // namespace
}  // namespace touchstone
