// Contract conformance suite: every backend runs the same checks of the session
// contract (touchstone/abi/backend_abi.h) on the real model, like IREE's HAL CTS.
//
// What it runs against: flags (touchstone/conformance/target.h), set by
// touchstone_add_contract_tests in CMake.
// Tolerance for "same logits" between two computations of the same position:
// bitwise when the backend claims TS_CAP_BITWISE_DETERMINISM for repeated runs;
// prefill(N) vs N decode steps may legitimately use different kernels (GEMM vs
// GEMV), so they must agree to max|a-b| <= 1e-3 * max(1, max|a|) and NMSE <= 1e-8
// (docs/contract.md), and the argmax must agree. The same tolerance holds for a
// step_batch entry or a forked session against its own prefill, bitwise instead
// when the backend claims TS_CAP_BATCH_INVARIANT for the weight path; with
// --profile (a profile of --manifest), those serving
// comparisons take that profile's logits_nmse_max / logits_max_abs_max and its
// near-tie rule instead, as the serving checks do (docs/serving-checks.md): for
// paths such as llama.cpp's int8 activations, where a batch or a shared KV
// prefix places the cells differently and the reassociation crosses int8
// rounding boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>

#include "touchstone/conformance/target.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/metrics/metrics.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

const conformance::Target& target() { return conformance::target(); }

class Contract : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string& path = target().model;
    if (path.empty() || !std::filesystem::exists(path)) return;
    try {
      // --child: the same suite through the child-process protocol, which must
      // be indistinguishable from the C ABI in process.
      lib_ = target().child ? BackendLibrary::spawn(target().backend, ChildOptions{})
                            : BackendLibrary::load(target().backend);
      model_ = std::make_unique<BackendModel>(lib_, path);
    } catch (const BackendError& e) {
      if (e.status() != TS_ERR_DEVICE) throw;
      skip_reason_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    model_.reset();
    lib_.reset();
  }
  void SetUp() override {
    if (target().model.empty()) GTEST_SKIP() << "no --model given";
    if (!std::filesystem::exists(target().model)) {
      GTEST_SKIP() << "model not found: " << target().model << " (ci/bootstrap fetches it)";
    }
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    ASSERT_TRUE(model_) << "model not loaded";
  }
  BackendSessionOptions options() const {
    BackendSessionOptions o;
    o.weight_path =
        target().weights == "quantized" ? TS_WEIGHTS_QUANTIZED : TS_WEIGHTS_FULL_PRECISION;
    o.max_context = 256;
    return o;
  }
  bool deterministic() const {
    return (lib_->capabilities().flags & TS_CAP_BITWISE_DETERMINISM) != 0;
  }
  // The bitwise claim extends to a fork and its source (not withdrawn there by
  // TS_CAP_BITWISE_NOT_ACROSS_FORKS), or batch invariance covers them.
  bool fork_deterministic() const {
    return batch_invariant() ||
           (deterministic() && (lib_->capabilities().flags & TS_CAP_BITWISE_NOT_ACROSS_FORKS) == 0);
  }
  // TS_CAP_BATCH_INVARIANT covering this suite's weight path (paths 0 = all).
  bool batch_invariant() const {
    const ts_capabilities c = lib_->capabilities();
    const uint32_t path = 1u << uint32_t(options().weight_path);
    return (c.flags & TS_CAP_BATCH_INVARIANT) &&
           (c.batch_invariant_paths == 0 || (c.batch_invariant_paths & path));
  }

 public:  // skip_reason_ is read by main()
  static inline std::shared_ptr<BackendLibrary> lib_;
  static inline std::unique_ptr<BackendModel> model_;
  static inline std::string skip_reason_;
};

const std::vector<int32_t> kTokens = {1, 504, 3458, 253, 1135, 28, 354, 2114, 314, 216, 1978, 30};

void expect_close(std::span<const float> a, std::span<const float> b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double amax = 0;
  for (float x : a) amax = std::max(amax, double(std::abs(x)));
  EXPECT_LE(metrics::max_abs_diff(a, b), 1e-3 * std::max(1.0, amax)) << what;
  EXPECT_LE(metrics::nmse(a, b), 1e-8) << what;
  EXPECT_EQ(metrics::argmax(a), metrics::argmax(b)) << what;
}

// --profile's profile (nullopt: the suite's own tolerance).
const std::optional<Profile>& serving_profile() {
  static const std::optional<Profile> p = []() -> std::optional<Profile> {
    if (target().profile.empty()) return std::nullopt;
    return load_manifest(target().manifest).find_profile(target().profile);
  }();
  return p;
}

// `a` against `want` by a profile's logits criteria; a different argmax only in
// a near tie of `want` (top-1 minus the runner-up below near_tie_margin).
void expect_within_profile(std::span<const float> a, std::span<const float> want, const Profile& p,
                           const std::string& what) {
  ASSERT_EQ(a.size(), want.size());
  if (p.logits_nmse_max) {
    EXPECT_LE(metrics::nmse(a, want), *p.logits_nmse_max) << what << " (profile " << p.name << ")";
  }
  if (p.logits_max_abs_max) {
    EXPECT_LE(metrics::max_abs_diff(a, want), *p.logits_max_abs_max)
        << what << " (profile " << p.name << ")";
  }
  const int32_t top = metrics::argmax(want);
  if (metrics::argmax(a) == top) return;
  float second = -INFINITY;
  for (size_t i = 0; i < want.size(); ++i)
    if (int32_t(i) != top) second = std::max(second, want[i]);
  EXPECT_LT(double(want[size_t(top)]) - second, p.near_tie_margin)
      << what << ": argmax differs outside a near tie (profile " << p.name << ")";
}

TEST_F(Contract, CapabilitiesAreSane) {
  const ts_capabilities c = lib_->capabilities();
  EXPECT_EQ(c.struct_size, sizeof(ts_capabilities));
  EXPECT_NE(c.weight_types & TS_WEIGHT_TYPE_BIT(0), 0u) << "every backend must consume F32 tensors";
  EXPECT_GE(c.n_shape_buckets, 0);
  EXPECT_LE(c.n_shape_buckets, 16);
  if (!(c.flags & TS_CAP_BITWISE_DETERMINISM)) {
    EXPECT_NE(c.determinism_note, nullptr) << "a non-deterministic backend must say why";
  }
  EXPECT_FALSE(lib_->device_name().empty());
  EXPECT_EQ(model_->n_vocab(), 49152);
}

TEST_F(Contract, PrefillMatchesStepwiseDecode) {
  BackendSession a(*model_, options());
  const std::vector<float> pre = a.prefill(kTokens);
  EXPECT_EQ(a.position(), int32_t(kTokens.size()));
  BackendSession b(*model_, options());
  std::vector<float> step = b.prefill(std::span<const int32_t>(kTokens.data(), 1));
  for (size_t i = 1; i < kTokens.size(); ++i) b.decode(kTokens[i], step);
  expect_close(pre, step, "prefill(12) vs prefill(1) + 11 decode steps");
}

TEST_F(Contract, AllPositionLogitsMatchLastPosition) {
  if (!(lib_->capabilities().flags & TS_CAP_ALL_POSITION_LOGITS))
    GTEST_SKIP() << "no all-position logits";
  BackendSession a(*model_, options());
  const std::vector<float> all = a.prefill_all(kTokens);
  BackendSession b(*model_, options());
  const std::vector<float> last = b.prefill(kTokens);
  const size_t V = last.size();
  ASSERT_EQ(all.size(), V * kTokens.size());
  expect_close(last, std::span<const float>(all.data() + (kTokens.size() - 1) * V, V), "last row");
}

TEST_F(Contract, RewindThenReplayReproducesLogits) {
  BackendSession s(*model_, options());
  s.prefill(std::span<const int32_t>(kTokens.data(), 6));
  std::vector<float> first(size_t(s.n_vocab())), again(size_t(s.n_vocab()));
  s.decode(kTokens[6], first);
  s.decode(kTokens[7], again);  // garbage we will rewind over
  s.rewind(6);
  EXPECT_EQ(s.position(), 6);
  s.decode(kTokens[6], again);
  if (deterministic()) {
    EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)))
        << "deterministic backend: rewind + replay must be bitwise identical";
  } else {
    expect_close(first, again, "rewind + replay");
  }
  s.rewind(0);
  EXPECT_EQ(s.position(), 0);
}

// ABI v4 layer taps: the record has n_layer x 3 x n_embd floats, describes the
// last position of the call (prefill(12) records what prefill(11) + decode
// records), leaves the logits unchanged, and a read before any record, of the
// wrong size or after set_taps(0) is an error, not a crash.
TEST_F(Contract, LayerTapsRecordTheLastPositionAndLeaveLogitsAlone) {
  if (!lib_->has_taps()) GTEST_SKIP() << "no layer taps (ABI v4 set_taps/read_taps)";
  const ModelConfig c = read_model_config(gguf::File::open_metadata(target().model));
  const size_t n = size_t(c.n_layer) * TS_TAP_POINTS * size_t(c.n_embd);
  BackendSession plain(*model_, options());
  const std::vector<float> want = plain.prefill(kTokens);

  BackendSession s(*model_, options());
  s.set_taps(true);
  EXPECT_THROW(s.read_taps(n), BackendError) << "read before any call";
  const std::vector<float> got = s.prefill(kTokens);
  if (deterministic()) {
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
        << "recording taps changed the logits";
  } else {
    expect_close(want, got, "logits with taps on");
  }
  const std::vector<float> taps = s.read_taps(n);
  EXPECT_THROW(s.read_taps(n - 1), BackendError) << "wrong size";
  for (float v : taps) ASSERT_TRUE(std::isfinite(v));

  BackendSession d(*model_, options());
  d.set_taps(true);
  d.prefill(std::span<const int32_t>(kTokens.data(), kTokens.size() - 1));
  std::vector<float> logits(size_t(d.n_vocab()));
  d.decode(kTokens.back(), logits);
  const std::vector<float> step = d.read_taps(n);
  EXPECT_LE(metrics::nmse(taps, step), 1e-8) << "prefill's record is not the last position's";
  // Each layer's residual is the previous residual plus both block outputs.
  const size_t D = size_t(c.n_embd);
  for (int32_t l = 1; l < c.n_layer; ++l) {
    const float* prev = taps.data() + (size_t(l - 1) * 3 + TS_TAP_RESIDUAL) * D;
    const float* at = taps.data() + (size_t(l) * 3 + TS_TAP_ATTN_OUT) * D;
    const float* ffn = taps.data() + (size_t(l) * 3 + TS_TAP_FFN_OUT) * D;
    const float* res = taps.data() + (size_t(l) * 3 + TS_TAP_RESIDUAL) * D;
    std::vector<float> sum(D), out(res, res + D);
    for (size_t i = 0; i < D; ++i) sum[i] = prev[i] + at[i] + ffn[i];
    ASSERT_LE(metrics::nmse(out, sum), 1e-10) << "layer " << l << ": residual != prev + attn + ffn";
  }
  s.set_taps(false);
  EXPECT_THROW(s.read_taps(n), BackendError) << "read after set_taps(0)";
}

// TS_CAP_DEVICE_GREEDY: prefill_greedy appends like prefill and returns the
// argmax (lowest id on ties) of the logits prefill would have returned.
TEST_F(Contract, DeviceGreedyIsTheArgmaxOfTheLogits) {
  if (!(lib_->capabilities().flags & TS_CAP_DEVICE_GREEDY)) GTEST_SKIP() << "no device greedy";
  BackendSession a(*model_, options());
  ASSERT_TRUE(a.has_device_greedy());
  BackendSession b(*model_, options());
  const std::span<const int32_t> prompt(kTokens.data(), 8);
  EXPECT_EQ(a.prefill_greedy(prompt), metrics::argmax(b.prefill(prompt)));
  EXPECT_EQ(a.position(), 8);
  std::vector<float> row(size_t(b.n_vocab()));
  for (size_t i = 8; i < kTokens.size(); ++i) {  // decode steps
    b.decode(kTokens[i], row);
    EXPECT_EQ(a.prefill_greedy(std::span<const int32_t>(&kTokens[i], 1)), metrics::argmax(row))
        << "step " << i;
  }
  EXPECT_EQ(a.position(), int32_t(kTokens.size()));
  const int32_t bad = a.n_vocab();
  EXPECT_THROW(a.prefill_greedy(std::span<const int32_t>(&bad, 1)), BackendError);
  EXPECT_EQ(a.position(), int32_t(kTokens.size())) << "a refused call must not advance";
}

TEST_F(Contract, RepeatedRunsAreBitwiseIdenticalWhenClaimed) {
  if (!deterministic()) GTEST_SKIP() << "backend does not claim bitwise determinism";
  BackendSession a(*model_, options()), b(*model_, options());
  const std::vector<float> x = a.prefill(kTokens), y = b.prefill(kTokens);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
}

TEST_F(Contract, BadArgumentsAreErrorsNotCrashes) {
  BackendSession s(*model_, options());
  const std::vector<int32_t> bad = {1, 49152};
  try {
    s.prefill(bad);
    ADD_FAILURE() << "out-of-range token accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_INVALID_ARGUMENT) << e.what();
    EXPECT_NE(std::string(e.what()).find("49152"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.position(), 0) << "a rejected prefill must not change the position";
  try {
    s.rewind(5);
    ADD_FAILURE() << "rewind past the end accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_INVALID_ARGUMENT) << e.what();
  }
}

TEST_F(Contract, ContextFullIsReported) {
  BackendSessionOptions o = options();
  o.max_context = 8;
  BackendSession s(*model_, o);
  s.prefill(std::span<const int32_t>(kTokens.data(), 8));
  std::vector<float> logits(size_t(s.n_vocab()));
  try {
    s.decode(kTokens[8], logits);
    ADD_FAILURE() << "decode beyond max_context accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_CONTEXT_FULL) << e.what();
  }
  EXPECT_EQ(s.position(), 8);
}

TEST_F(Contract, UnknownFaultIsRefused) {
  BackendSessionOptions o = options();
  o.fault = "no_such_fault";
  try {
    BackendSession s(*model_, o);
    ADD_FAILURE() << "unknown fault accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_UNSUPPORTED) << e.what();
  }
}

// Every name of the fault catalog (touchstone/model/faults.h) is either accepted (the
// backend implements it; its fault.* CTests prove the effect) or refused with
// TS_ERR_UNSUPPORTED naming the fault; never another error or a crash. A name
// added to the catalog is therefore a decision every backend makes.
TEST_F(Contract, EveryCatalogFaultIsImplementedOrRefused) {
  try {
    BackendSession plain(*model_, options());
  } catch (const BackendError& e) {
    if (e.status() == TS_ERR_UNSUPPORTED) GTEST_SKIP() << "weight path refused: " << e.what();
    throw;
  }
  for (const std::string& name : fault_names()) {
    BackendSessionOptions o = options();
    o.fault = name;
    try {
      BackendSession s(*model_, o);
    } catch (const BackendError& e) {
      EXPECT_EQ(e.status(), TS_ERR_UNSUPPORTED) << name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos)
          << "the refusal of fault '" << name << "' does not name it: " << e.what();
    }
  }
}

TEST_F(Contract, MissingModelFileIsAnIoError) {
  try {
    BackendModel m(lib_, "/nonexistent/model.gguf");
    ADD_FAILURE() << "missing file accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_IO) << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos) << e.what();
  }
}

// Bitwise when `bitwise`, else the suite's tolerance, row by row (rows of n_vocab).
void expect_same_rows(std::span<const float> got, std::span<const float> want, size_t V,
                      bool bitwise, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r * V < got.size(); ++r) {
    const std::string at = what + ", row " + std::to_string(r);
    if (bitwise) {
      EXPECT_EQ(0, std::memcmp(got.data() + r * V, want.data() + r * V, V * sizeof(float)))
          << at << ": TS_CAP_BATCH_INVARIANT claimed, so bitwise equal";
    } else if (serving_profile()) {
      expect_within_profile(got.subspan(r * V, V), want.subspan(r * V, V), *serving_profile(), at);
    } else {
      expect_close(got.subspan(r * V, V), want.subspan(r * V, V), at);
    }
  }
}

// ABI v6 step_batch: a decode step, a prefill chunk of 5 and an all-positions
// chunk of 3, at different positions, in one call: each entry's logits are the
// ones its own prefill gives.
TEST_F(Contract, StepBatchEntriesMatchTheirOwnPrefill) {
  if (!lib_->channel().info().step_batch) GTEST_SKIP() << "no step_batch (ABI v6)";
  const bool all = (lib_->capabilities().flags & TS_CAP_ALL_POSITION_LOGITS) != 0;
  const std::span<const int32_t> t(kTokens);
  struct Plan {
    size_t prefix, n;
    bool all;
  };
  const Plan plan[3] = {{6, 1, false}, {2, 5, false}, {1, 3, all}};
  std::vector<std::unique_ptr<BackendSession>> batch, alone;
  std::vector<std::vector<float>> got(3);
  std::vector<BackendSession::Step> steps;
  const size_t V = size_t(model_->n_vocab());
  for (size_t i = 0; i < 3; ++i) {
    batch.push_back(std::make_unique<BackendSession>(*model_, options()));
    batch[i]->prefill(t.first(plan[i].prefix));
    got[i].resize(plan[i].all ? plan[i].n * V : V);
    steps.push_back({batch[i].get(), t.subspan(plan[i].prefix, plan[i].n), plan[i].all, got[i]});
  }
  BackendSession::step_batch(steps);
  const bool bitwise = batch_invariant();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(batch[i]->position(), int32_t(plan[i].prefix + plan[i].n)) << "entry " << i;
    BackendSession s(*model_, options());
    s.prefill(t.first(plan[i].prefix));
    const auto chunk = t.subspan(plan[i].prefix, plan[i].n);
    const std::vector<float> want = plan[i].all ? s.prefill_all(chunk) : s.prefill(chunk);
    expect_same_rows(got[i], want, V, bitwise, "entry " + std::to_string(i));
  }
}

// A refused entry fails the whole call, names the entry and moves no session.
TEST_F(Contract, StepBatchErrorsNameTheEntryAndMoveNothing) {
  if (!lib_->channel().info().step_batch) GTEST_SKIP() << "no step_batch (ABI v6)";
  BackendSessionOptions small = options();
  small.max_context = 8;
  BackendSession a(*model_, options()), b(*model_, options()), c(*model_, small);
  a.prefill(std::span<const int32_t>(kTokens.data(), 3));
  c.prefill(std::span<const int32_t>(kTokens.data(), 6));
  const size_t V = size_t(model_->n_vocab());
  std::vector<float> la(V), lb(V), lc(V);
  const std::vector<int32_t> ok = {kTokens[3]}, bad = {1, int32_t(V)}, three = {5, 6, 7};
  auto refused = [&](const std::vector<BackendSession::Step>& steps, ts_status want,
                     const char* entry) {
    try {
      BackendSession::step_batch(steps);
      ADD_FAILURE() << "refused batch accepted (" << entry << ")";
    } catch (const BackendError& e) {
      EXPECT_EQ(e.status(), want) << e.what();
      EXPECT_NE(std::string(e.what()).find(entry), std::string::npos) << e.what();
    }
    EXPECT_EQ(a.position(), 3);
    EXPECT_EQ(b.position(), 0);
    EXPECT_EQ(c.position(), 6);
  };
  refused({{&a, ok, false, la}, {&b, bad, false, lb}}, TS_ERR_INVALID_ARGUMENT, "entry 1");
  refused({{&a, ok, false, la}, {&b, ok, false, lb}, {&c, three, false, lc}}, TS_ERR_CONTEXT_FULL,
          "entry 2");
  // The sessions are still usable.
  BackendSession::step_batch(
      std::vector<BackendSession::Step>{{&a, ok, false, la}, {&b, ok, false, lb}});
  EXPECT_EQ(a.position(), 4);
  EXPECT_EQ(b.position(), 1);
}

// ABI v6 fork_session: the fork holds the first n_prefix positions, continues
// like a fresh session fed the same tokens, and the source is untouched and
// outlives nothing it needs (either may be freed first).
TEST_F(Contract, ForkContinuesLikeAFreshSession) {
  if (!lib_->has_fork()) GTEST_SKIP() << "no fork_session (ABI v6)";
  const std::span<const int32_t> t(kTokens);
  const std::span<const int32_t> cont = t.subspan(9, 3);
  const size_t V = size_t(model_->n_vocab());
  auto src = std::make_unique<BackendSession>(*model_, options());
  src->prefill(t.first(8));
  for (int32_t n : {5, 8, 0}) {
    auto f = src->fork(n);
    ASSERT_EQ(f->position(), n);
    EXPECT_EQ(src->position(), 8);
    if (n == 0) src.reset();  // the source freed first
    BackendSession fresh(*model_, options());
    if (n > 0) fresh.prefill(t.first(size_t(n)));
    // A partial prefix was computed in a chunk of 8 by the source, in a chunk of
    // n by the fresh session: bitwise only when batch invariant.
    const bool bitwise = (n == 0 || n == 8) ? fork_deterministic() : batch_invariant();
    expect_same_rows(f->prefill(cont), fresh.prefill(cont), V, bitwise,
                     "fork at " + std::to_string(n));
  }
}

TEST_F(Contract, ForkLeavesTheSourceUsable) {
  if (!lib_->has_fork()) GTEST_SKIP() << "no fork_session (ABI v6)";
  const std::span<const int32_t> t(kTokens);
  BackendSession src(*model_, options());
  src.prefill(t.first(8));
  {
    auto f = src.fork(4);
    f->prefill(t.subspan(9, 3));  // the fork advances; the source must not see it
    f->rewind(2);
  }  // the fork freed first
  EXPECT_EQ(src.position(), 8);
  BackendSession ref(*model_, options());
  ref.prefill(t.first(8));
  const std::vector<float> got = src.prefill(t.subspan(8, 4)), want = ref.prefill(t.subspan(8, 4));
  const size_t V = size_t(model_->n_vocab());
  expect_same_rows(got, want, V, fork_deterministic(), "the source after a fork");
  EXPECT_THROW(src.fork(src.position() + 1), Error);
}

}  // namespace

// A backend without a device here must show up as SKIPPED in CTest (exit 77), never as passed.
bool contract_skipped() { return !Contract::skip_reason_.empty(); }

}  // namespace touchstone

// GoogleTest's flags first, then the suite's own (target.h); a bad flag exits 2.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    touchstone::conformance::set_target(touchstone::conformance::parse_target(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "touchstone-contract-test: %s\n", e.what());
    return 2;
  }
  const int rc = RUN_ALL_TESTS();
  if (rc == 0 && touchstone::contract_skipped()) return 77;
  return rc;
}
