// The serving operations of the reference (backend_abi.h ABI v6) on the tiny
// models of every family: fork is a fresh session bit for bit, step_batch is
// each session's own prefill bit for bit (whatever the batch holds), and each
// serving fault changes exactly what its catalog entry says and nothing else.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tiny_family.h"
#include "touchstone/model/gguf.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
namespace {

namespace gg = touchstone::gguf;
using Logits = std::vector<float>;
using Tokens = std::vector<int32_t>;

const char* const kFamilies[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};

StoredWeights load(const std::string& arch) {
  testing::TinyOptions o;
  o.arch = arch;
  if (arch == "gemma3") o.sliding_window = 4;
  gg::testing::TempFile f(testing::tiny_model(o), "serving");
  return load_stored_weights(f.path());
}

std::unique_ptr<ReferenceTransformer> open(const StoredWeights& w, const std::string& fault = "") {
  return std::make_unique<ReferenceTransformer>(w, 64, 2, parse_fault(fault));
}

// prefill(), returning the logits (every row when all).
Logits prefill(ReferenceTransformer& r, const Tokens& t, bool all) {
  Logits out((all ? t.size() : 1) * size_t(r.n_vocab()));
  r.prefill(t, all, out);
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every cached K and V row of [0, n) equal bit for bit in every layer.
bool same_kv(const ReferenceTransformer& a, const ReferenceTransformer& b, int32_t n,
             int32_t n_layer) {
  for (int32_t l = 0; l < n_layer; ++l)
    for (int32_t p = 0; p < n; ++p)
      if (!same_bits(a.k_row(l, p), b.k_row(l, p)) || !same_bits(a.v_row(l, p), b.v_row(l, p)))
        return false;
  return true;
}

const Tokens kPrompt = {1, 7, 3, 30, 12, 5, 9, 2, 17, 4};

TEST(Serving, ForkIsAFreshSessionBitwise) {
  for (const char* arch : kFamilies) {
    const StoredWeights w = load(arch);
    auto src = open(w);
    prefill(*src, kPrompt, false);
    for (int32_t n : {0, 1, 6, int32_t(kPrompt.size())}) {
      auto forked = src->fork(n);
      ASSERT_EQ(forked->position(), n);
      auto fresh = open(w);
      if (n > 0) prefill(*fresh, Tokens(kPrompt.begin(), kPrompt.begin() + n), false);
      EXPECT_TRUE(same_kv(*forked, *fresh, n, w.config.n_layer)) << arch << " n_prefix " << n;
      const Tokens next = {11, 6, 28};
      EXPECT_TRUE(same_bits(prefill(*forked, next, true), prefill(*fresh, next, true)))
          << arch << " n_prefix " << n;
    }
    // The source is unchanged and independent of its forks.
    auto forked = src->fork(4);
    forked->rewind(1);
    prefill(*forked, {8, 8, 8, 8, 8, 8, 8}, false);
    forked.reset();
    auto fresh = open(w);
    prefill(*fresh, kPrompt, false);
    EXPECT_EQ(src->position(), int32_t(kPrompt.size()));
    EXPECT_TRUE(same_bits(prefill(*src, {3}, false), prefill(*fresh, {3}, false))) << arch;
  }
}

// Three sessions at different positions: a decode step, a prefill chunk with
// every row, a decode step. Each entry's logits and KV entries must be the
// bits of its own prefill on an identical session.
struct BatchRun {
  std::vector<std::unique_ptr<ReferenceTransformer>> sessions;
  std::vector<Logits> logits;
};

const std::vector<Tokens> kHistories = {{1, 2, 3, 4, 5}, {9, 9}, {30, 1, 7, 3, 22, 6, 2, 8}};
const std::vector<Tokens> kSteps = {{14}, {3, 17, 5, 21}, {0}};
const bool kAll[] = {false, true, false};

BatchRun start(const StoredWeights& w, const std::string& fault) {
  BatchRun run;
  for (const Tokens& h : kHistories) {
    run.sessions.push_back(open(w, fault));
    prefill(*run.sessions.back(), h, false);
  }
  return run;
}

// One step_batch call over every session, in the given order of entries.
BatchRun batched(const StoredWeights& w, const std::string& fault,
                 const std::vector<size_t>& order = {0, 1, 2}) {
  BatchRun run = start(w, fault);
  for (size_t i = 0; i < kSteps.size(); ++i)
    run.logits.emplace_back((kAll[i] ? kSteps[i].size() : 1) * size_t(w.config.n_vocab));
  std::vector<ReferenceTransformer::BatchEntry> entries;
  for (size_t i : order)
    entries.push_back({run.sessions[i].get(), kSteps[i], kAll[i], run.logits[i]});
  ReferenceTransformer::step_batch(entries);
  return run;
}

BatchRun one_by_one(const StoredWeights& w, const std::string& fault) {
  BatchRun run = start(w, fault);
  for (size_t i = 0; i < kSteps.size(); ++i)
    run.logits.push_back(prefill(*run.sessions[i], kSteps[i], kAll[i]));
  return run;
}

// Which entries of a faulted step_batch differ from the clean per-session prefill.
std::vector<bool> differs(const StoredWeights& w, const std::string& fault) {
  const BatchRun faulty = batched(w, fault), clean = one_by_one(w, "");
  std::vector<bool> out;
  for (size_t i = 0; i < kSteps.size(); ++i) {
    const auto n = int32_t(kHistories[i].size() + kSteps[i].size());
    EXPECT_EQ(faulty.sessions[i]->position(), n) << fault;
    out.push_back(!same_bits(faulty.logits[i], clean.logits[i]) ||
                  !same_kv(*faulty.sessions[i], *clean.sessions[i], n, w.config.n_layer));
  }
  return out;
}

TEST(Serving, StepBatchIsEachSessionsOwnPrefillBitwise) {
  for (const char* arch : kFamilies) {
    const StoredWeights w = load(arch);
    EXPECT_EQ(differs(w, ""), std::vector<bool>({false, false, false})) << arch;
    // The same entries in another order, and a batch of one entry.
    BatchRun one = start(w, ""), clean = one_by_one(w, "");
    const BatchRun reversed = batched(w, "", {2, 1, 0});
    for (size_t i = 0; i < kSteps.size(); ++i)
      EXPECT_TRUE(same_bits(reversed.logits[i], clean.logits[i])) << arch << " entry " << i;
    Logits out(kSteps[1].size() * size_t(w.config.n_vocab));
    const ReferenceTransformer::BatchEntry entry{one.sessions[1].get(), kSteps[1], true, out};
    ReferenceTransformer::step_batch({&entry, 1});
    EXPECT_TRUE(same_bits(out, clean.logits[1])) << arch;
  }
}

TEST(Serving, StepBatchRefusesBadEntriesBeforeRunningAny) {
  const StoredWeights w = load("llama");
  auto s = open(w);
  Logits a(size_t(w.config.n_vocab)), b(a.size());
  const Tokens t = {3};
  const ReferenceTransformer::BatchEntry e[] = {{s.get(), t, false, a}, {s.get(), t, false, b}};
  EXPECT_THROW(ReferenceTransformer::step_batch(e), Error);
  EXPECT_EQ(s->position(), 0);
  // A wrong buffer in a later entry: refused before entry 0 runs.
  auto other = open(w);
  Logits short_buffer(a.size() - 1);
  const ReferenceTransformer::BatchEntry f[] = {{s.get(), t, false, a},
                                                {other.get(), t, false, short_buffer}};
  EXPECT_THROW(ReferenceTransformer::step_batch(f), Error);
  EXPECT_EQ(s->position(), 0);
}

TEST(Serving, BatchFaultsLeavePrefillAlone) {
  const StoredWeights w = load("qwen3");
  for (const char* fault :
       {"batch_token_count_split", "batch_kv_leak", "batch_position_offset", "fork_short_copy"}) {
    const BatchRun faulty = one_by_one(w, fault), clean = one_by_one(w, "");
    for (size_t i = 0; i < kSteps.size(); ++i)
      EXPECT_TRUE(same_bits(faulty.logits[i], clean.logits[i])) << fault << " session " << i;
  }
}

TEST(Serving, BatchTokenCountSplitChangesEveryEntryOnlyInStepBatch) {
  for (const char* arch : kFamilies) {
    const StoredWeights w = load(arch);
    EXPECT_EQ(differs(w, "batch_token_count_split"), std::vector<bool>({true, true, true})) << arch;
    // A rounding-sized change (fp32 partial sums), not a different model.
    const BatchRun faulty = batched(w, "batch_token_count_split"), clean = one_by_one(w, "");
    for (size_t i = 0; i < kSteps.size(); ++i)
      for (size_t k = 0; k < clean.logits[i].size(); ++k)
        EXPECT_NEAR(faulty.logits[i][k], clean.logits[i][k], 1e-3) << arch;
  }
}

TEST(Serving, BatchKvLeakChangesEveryEntryButTheFirst) {
  for (const char* arch : kFamilies) {
    EXPECT_EQ(differs(load(arch), "batch_kv_leak"), std::vector<bool>({false, true, true})) << arch;
  }
}

TEST(Serving, BatchPositionOffsetChangesEveryEntryButTheFirst) {
  for (const char* arch : kFamilies) {
    EXPECT_EQ(differs(load(arch), "batch_position_offset"), std::vector<bool>({false, true, true}))
        << arch;
  }
}

TEST(Serving, ForkShortCopyLeavesTheLastPrefixRowZero) {
  const StoredWeights w = load("llama");
  auto src = open(w, "fork_short_copy");
  prefill(*src, kPrompt, false);
  auto forked = src->fork(6);
  ASSERT_EQ(forked->position(), 6);
  EXPECT_TRUE(same_kv(*forked, *src, 5, w.config.n_layer));
  for (int32_t l = 0; l < w.config.n_layer; ++l) {
    for (float x : forked->k_row(l, 5)) EXPECT_EQ(x, 0.0f);
    for (float x : forked->v_row(l, 5)) EXPECT_EQ(x, 0.0f);
  }
  auto fresh = open(w);
  prefill(*fresh, Tokens(kPrompt.begin(), kPrompt.begin() + 6), false);
  EXPECT_FALSE(same_bits(prefill(*forked, {3}, false), prefill(*fresh, {3}, false)));
  EXPECT_EQ(src->fork(0)->position(), 0);  // nothing to drop
  // Not a step_batch fault: a batch of clean sessions is unchanged.
  EXPECT_EQ(differs(w, "fork_short_copy"), std::vector<bool>({false, false, false}));
}

TEST(Serving, VerifyRowShiftShiftsContinuingAllPositionPrefills) {
  for (const char* arch : kFamilies) {
    const StoredWeights w = load(arch);
    const auto v = size_t(w.config.n_vocab);
    auto faulty = open(w, "verify_row_shift"), clean = open(w);
    // From position 0: unchanged.
    EXPECT_TRUE(same_bits(prefill(*faulty, kPrompt, true), prefill(*clean, kPrompt, true)));
    // Continuing: row i holds row i-1 (row 0 kept); the KV cache is right.
    const Tokens next = {4, 19, 2};
    const Logits got = prefill(*faulty, next, true), want = prefill(*clean, next, true);
    EXPECT_TRUE(same_bits(std::span(got).first(v), std::span(want).first(v))) << arch;
    for (size_t i = 1; i < next.size(); ++i)
      EXPECT_TRUE(
          same_bits(std::span(got).subspan(i * v, v), std::span(want).subspan((i - 1) * v, v)))
          << arch << " row " << i;
    EXPECT_TRUE(same_kv(*faulty, *clean, faulty->position(), w.config.n_layer)) << arch;
    // Last-row prefills and decode steps are unchanged.
    EXPECT_TRUE(same_bits(prefill(*faulty, {7, 7}, false), prefill(*clean, {7, 7}, false)));
    // In step_batch: only the all-position entry (continuing at position 2) moves.
    EXPECT_EQ(differs(w, "verify_row_shift"), std::vector<bool>({false, true, false})) << arch;
  }
}

}  // namespace
}  // namespace touchstone
