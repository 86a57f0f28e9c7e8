// serving_fault_test.cpp - the eight serving faults of the catalog
// (touchstone/model/faults.h: Faults) on cpu_simd, quantized path (batch
// invariant, so a clean batch equals the sessions alone bit for bit): each
// changes the result it names and nothing else; also layer taps in a batch and
// sessions of different faults in one call. Real model; skipped without it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu_simd_backend.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/test_model.h"

namespace {

std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + seed * 104729 + 17) % 49152);
  return t;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ServingFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(touchstone::test::real_model_path())) return;
    api_ = touchstone::cpu_simd::backend_table();
    ASSERT_EQ(api_->load_model(touchstone::test::real_model_path().c_str(), &model_), TS_OK)
        << api_->last_error();
    V_ = size_t(api_->n_vocab(model_));
  }
  static void TearDownTestSuite() {
    if (model_) api_->free_model(model_);
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << touchstone::test::real_model_path();
  }
  // A session with `fault` ("" = none) that has prefilled `prefix` tokens.
  ts_session* open(const char* fault, size_t prefix, uint32_t seed) {
    ts_session_options o{};
    o.struct_size = sizeof o;
    o.weight_path = TS_WEIGHTS_QUANTIZED;
    o.n_threads = 2;
    o.max_context = 256;
    o.fault = *fault ? fault : nullptr;
    ts_session* s = nullptr;
    EXPECT_EQ(api_->open_session(model_, &o, &s), TS_OK) << api_->last_error();
    if (prefix > 0) prefill(s, tokens(prefix, seed), false);
    return s;
  }
  std::vector<float> prefill(ts_session* s, const std::vector<int32_t>& t, bool all) {
    std::vector<float> out((all ? t.size() : 1) * V_);
    EXPECT_EQ(api_->prefill(s, t.data(), int32_t(t.size()), int32_t(all), out.data()), TS_OK)
        << api_->last_error();
    return out;
  }
  // Entry k: a session with `prefix` tokens of seed k, then tok[k] (all
  // positions when all[k]). Returns each entry's logits, batched (one
  // step_batch) or alone (one prefill each).
  struct Plan {
    std::vector<size_t> prefix;
    std::vector<std::vector<int32_t>> tok;
    std::vector<bool> all;
  };
  std::vector<std::vector<float>> run(const char* fault, const Plan& p, bool batched) {
    const size_t n = p.tok.size();
    std::vector<ts_session*> s(n);
    std::vector<std::vector<float>> out(n);
    std::vector<ts_batch_entry> e(n);
    for (size_t k = 0; k < n; ++k) {
      s[k] = open(fault, p.prefix[k], uint32_t(k));
      out[k].assign((p.all[k] ? p.tok[k].size() : 1) * V_, 0.0f);
      e[k] = {sizeof(ts_batch_entry), s[k],         p.tok[k].data(), int32_t(p.tok[k].size()),
              int32_t(p.all[k]),      out[k].data()};
    }
    if (batched) {
      EXPECT_EQ(api_->step_batch(e.data(), int32_t(n)), TS_OK) << api_->last_error();
    } else {
      for (size_t k = 0; k < n; ++k) out[k] = prefill(s[k], p.tok[k], p.all[k]);
    }
    for (ts_session* x : s) api_->free_session(x);
    return out;
  }
  Plan plan3() const {
    return {{5, 9, 0}, {tokens(6, 20), tokens(1, 21), tokens(3, 22)}, {true, false, true}};
  }
  static inline const ts_backend* api_ = nullptr;
  static inline ts_model* model_ = nullptr;
  static inline size_t V_ = 0;
};

// Sessions of different faults cannot share one pass: each runs alone (no
// leak from the clean entry 0 into the faulty entry 1).
TEST_F(ServingFaults, MixedFaultsRunEachSessionAlone) {
  const Plan p = plan3();
  const auto alone = run("", p, false);
  std::vector<ts_session*> s = {open("", 5, 0), open("batch_kv_leak", 9, 1)};
  std::vector<std::vector<float>> out = {std::vector<float>(6 * V_), std::vector<float>(V_)};
  std::vector<ts_batch_entry> e(2);
  for (size_t k = 0; k < 2; ++k) {
    e[k] = {sizeof(ts_batch_entry), s[k],         p.tok[k].data(), int32_t(p.tok[k].size()),
            int32_t(p.all[k]),      out[k].data()};
  }
  ASSERT_EQ(api_->step_batch(e.data(), 2), TS_OK) << api_->last_error();
  for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(same(out[k], alone[k])) << k;
  for (ts_session* x : s) api_->free_session(x);
}

// Layer taps in step_batch: each session that records them gets its own
// entry's last token, bitwise as its own prefill (quantized path).
TEST_F(ServingFaults, TapsRecordEachEntrysLastToken) {
  const touchstone::ModelConfig c = touchstone::read_model_config(
      touchstone::gguf::File::open(touchstone::test::real_model_path()));
  const size_t n = size_t(c.n_layer) * TS_TAP_POINTS * size_t(c.n_embd);
  const Plan p = plan3();
  std::vector<std::vector<float>> want(3, std::vector<float>(n)), got = want;
  std::vector<float> scratch(6 * V_);
  for (size_t k = 0; k < 3; k += 2) {  // entries 0 and 2 record taps, 1 does not
    ts_session* s = open("", p.prefix[k], uint32_t(k));
    ASSERT_EQ(api_->set_taps(s, 1), TS_OK);
    prefill(s, p.tok[k], p.all[k]);
    ASSERT_EQ(api_->read_taps(s, want[k].data(), int64_t(n)), TS_OK) << api_->last_error();
    api_->free_session(s);
  }
  std::vector<ts_session*> s(3);
  std::vector<std::vector<float>> out(3, std::vector<float>(6 * V_));
  std::vector<ts_batch_entry> e(3);
  for (size_t k = 0; k < 3; ++k) {
    s[k] = open("", p.prefix[k], uint32_t(k));
    if (k != 1) {
      ASSERT_EQ(api_->set_taps(s[k], 1), TS_OK);
    }
    e[k] = {sizeof(ts_batch_entry), s[k],         p.tok[k].data(), int32_t(p.tok[k].size()),
            int32_t(p.all[k]),      out[k].data()};
  }
  ASSERT_EQ(api_->step_batch(e.data(), 3), TS_OK) << api_->last_error();
  for (size_t k = 0; k < 3; k += 2) {
    ASSERT_EQ(api_->read_taps(s[k], got[k].data(), int64_t(n)), TS_OK) << api_->last_error();
    EXPECT_TRUE(same(got[k], want[k])) << k;
  }
  EXPECT_EQ(api_->read_taps(s[1], got[1].data(), int64_t(n)), TS_ERR_INVALID_ARGUMENT);
  for (ts_session* x : s) api_->free_session(x);
}

// The clean batch is each session alone, and a batch fault leaves calls
// outside step_batch alone.
TEST_F(ServingFaults, CleanBatchEqualsAloneAndBatchFaultsLeavePrefillAlone) {
  const Plan p = plan3();
  const auto alone = run("", p, false);
  EXPECT_EQ(run("", p, true), alone);
  for (const char* f : {"batch_token_count_split", "batch_kv_leak", "batch_position_offset"}) {
    const auto with = run(f, p, false);
    for (size_t k = 0; k < alone.size(); ++k) EXPECT_TRUE(same(with[k], alone[k])) << f << " " << k;
  }
}

// batch_token_count_split: every entry's dot products change in step_batch.
TEST_F(ServingFaults, TokenCountSplitChangesEveryEntry) {
  const Plan p = plan3();
  const auto alone = run("", p, false);
  const auto batched = run("batch_token_count_split", p, true);
  for (size_t k = 0; k < alone.size(); ++k) EXPECT_FALSE(same(batched[k], alone[k])) << k;
}

// batch_kv_leak and batch_position_offset: entry 0 unchanged, every later entry changed.
TEST_F(ServingFaults, KvLeakAndPositionOffsetChangeEntriesAfterTheFirst) {
  const Plan p = plan3();
  const auto alone = run("", p, false);
  for (const char* f : {"batch_kv_leak", "batch_position_offset"}) {
    const auto batched = run(f, p, true);
    EXPECT_TRUE(same(batched[0], alone[0])) << f;
    for (size_t k = 1; k < alone.size(); ++k) EXPECT_FALSE(same(batched[k], alone[k])) << f << k;
  }
}

// fork_short_copy: a fork of n > 0 positions misses its last KV entry (a
// fork of 0 and the source are unchanged).
TEST_F(ServingFaults, ForkShortCopyLosesTheLastEntry) {
  const auto next = tokens(3, 30);
  for (size_t n : {0u, 1u, 12u}) {
    ts_session* clean = open("", n, 0);
    const auto want = prefill(clean, next, true);
    ts_session* src = open("fork_short_copy", 12, 0);
    ts_session* f = nullptr;
    ASSERT_EQ(api_->fork_session(src, int32_t(n), &f), TS_OK) << api_->last_error();
    const auto got = prefill(f, next, true);
    EXPECT_EQ(same(got, want), n == 0) << n;
    ASSERT_EQ(api_->rewind(src, int32_t(n)), TS_OK);
    EXPECT_TRUE(same(prefill(src, next, true), want)) << "source, n " << n;
    for (ts_session* s : {clean, src, f}) api_->free_session(s);
  }
}

// verify_row_shift: an all-position call continuing a sequence returns row
// i-1 as row i (prefill and step_batch entries); from position 0, or with
// only the last row, nothing changes.
TEST_F(ServingFaults, VerifyRowShiftOnlyShiftsContinuingAllPositionCalls) {
  const Plan p = plan3();  // entries 0 and 2 all positions, entry 2 at position 0
  const auto alone = run("", p, false);
  for (bool batched : {false, true}) {
    const auto got = run("verify_row_shift", p, batched);
    EXPECT_TRUE(same(got[1], alone[1]));
    EXPECT_TRUE(same(got[2], alone[2]));
    // entry 0: 6 rows at positions 5..10, row i = the clean row i-1 (row 0 kept)
    const size_t rows = p.tok[0].size();
    ASSERT_EQ(got[0].size(), rows * V_);
    EXPECT_EQ(std::memcmp(got[0].data(), alone[0].data(), V_ * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(got[0].data() + V_, alone[0].data(), (rows - 1) * V_ * sizeof(float)), 0);
    EXPECT_FALSE(same(got[0], alone[0]));
  }
}

// fork_shared_kv: the fork writes into its source's KV rows, so the source
// continuing after the fork's own tokens reads them; a clean fork leaves it alone.
TEST_F(ServingFaults, ForkSharedKvLetsTheForkOverwriteTheSource) {
  const auto next = tokens(3, 40), theirs = tokens(4, 41);
  for (const char* f : {"", "fork_shared_kv"}) {
    ts_session* clean = open("", 12, 0);
    const auto want = prefill(clean, next, true);
    ts_session* src = open(f, 12, 0);
    ts_session* fork = nullptr;
    ASSERT_EQ(api_->fork_session(src, 8, &fork), TS_OK) << api_->last_error();
    prefill(fork, theirs, false);  // rows 8..11: the source's, if shared
    EXPECT_EQ(same(prefill(src, next, true), want), *f == 0) << f;
    for (ts_session* s : {clean, src, fork}) api_->free_session(s);
  }
}

// batch_all_positions_shift: in a step_batch of several entries, an
// all-position entry returns row i-1 as row i; alone, or in a batch of one,
// nothing changes.
TEST_F(ServingFaults, BatchAllPositionsShiftOnlyInSeveralEntryBatches) {
  const Plan p = plan3();  // entries 0 and 2 all positions
  const auto alone = run("", p, false);
  EXPECT_EQ(run("batch_all_positions_shift", p, false), alone);
  const auto got = run("batch_all_positions_shift", p, true);
  EXPECT_TRUE(same(got[1], alone[1]));
  for (size_t k : {0u, 2u}) {
    const size_t rows = p.tok[k].size();
    EXPECT_EQ(std::memcmp(got[k].data() + V_, alone[k].data(), (rows - 1) * V_ * sizeof(float)), 0)
        << k;
    EXPECT_FALSE(same(got[k], alone[k])) << k;
  }
  const Plan one = {{5}, {tokens(6, 20)}, {true}};
  EXPECT_EQ(run("batch_all_positions_shift", one, true), run("", one, false));
}

// batch_page_boundary_leak: entry i > 0 whose token sits at position 32 reads
// that row from entry i-1's cache; entry 0, and an entry away from a page
// boundary, are right.
TEST_F(ServingFaults, PageBoundaryLeakHitsOnlyLaterEntriesAtAPageStart) {
  const Plan p = {{20, 32, 9}, {tokens(1, 50), tokens(1, 51), tokens(2, 52)}, {false, false, true}};
  const auto alone = run("", p, false);
  EXPECT_EQ(run("batch_page_boundary_leak", p, false), alone);
  const auto got = run("batch_page_boundary_leak", p, true);
  EXPECT_TRUE(same(got[0], alone[0]));
  EXPECT_FALSE(same(got[1], alone[1]));  // position 32, entry 1
  EXPECT_TRUE(same(got[2], alone[2]));   // positions 9 and 10
}

}  // namespace
