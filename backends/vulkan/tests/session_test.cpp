// session_test.cpp - the built libtouchstone_backend_vulkan.so on the real
// model, through the harness loader: rewind, prefill-vs-decode consistency,
// argument errors. SKIPs without a Vulkan device or without the model file.
//
// Tolerance for prefill (all positions, chunks of 32) vs one-token decode:
// max |diff| <= 1e-4 logits. Every kernel reduces in the same order whatever
// the number of tokens in flight, so on lavapipe the two are bitwise equal;
// the bound leaves room for drivers that schedule reductions differently.
// Rewind must reproduce logits bit for bit (same kernels, same inputs).
#include <gtest/gtest.h>

#include "touchstone/test_model.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

std::string model_path() { return touchstone::test::real_model_path(); }

class SessionTest : public ::testing::TestWithParam<ts_weight_path> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "model not found: " << model_path();
    lib_ = BackendLibrary::load(TOUCHSTONE_VULKAN_LIB);
    try {
      model_ = std::make_unique<BackendModel>(lib_, model_path());
    } catch (const BackendError& e) {
      if (e.status() == TS_ERR_DEVICE) GTEST_SKIP() << "no Vulkan device: " << e.what();
      throw;
    }
  }
  std::unique_ptr<BackendSession> open(int32_t max_context = 256) {
    BackendSessionOptions o;
    o.weight_path = GetParam();
    o.max_context = max_context;
    return std::make_unique<BackendSession>(*model_, o);
  }
  static std::vector<int32_t> tokens(int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(100 + 37 * i);
    return t;
  }
  std::shared_ptr<BackendLibrary> lib_;
  std::unique_ptr<BackendModel> model_;
};

TEST_P(SessionTest, RewindReproducesLogitsBitForBit) {
  auto s = open();
  const auto t = tokens(12);
  const size_t V = size_t(s->n_vocab());
  s->prefill(std::span<const int32_t>(t.data(), 8));
  std::vector<float> a(V), b(V);
  s->decode(t[8], a);
  s->decode(t[9], a);
  EXPECT_EQ(s->position(), 10);
  s->rewind(9);
  EXPECT_EQ(s->position(), 9);
  s->decode(t[9], b);
  EXPECT_EQ(a, b) << "decode after rewind(9)";
  s->rewind(4);
  s->prefill(std::span<const int32_t>(t.data() + 4, 5));
  s->decode(t[9], b);
  EXPECT_EQ(a, b) << "prefill + decode after rewind(4)";
  s->rewind(0);
  const auto c = s->prefill(std::span<const int32_t>(t.data(), 10));
  EXPECT_EQ(a, c) << "prefill after rewind(0)";
}

TEST_P(SessionTest, PrefillMatchesDecode) {
  auto s = open();
  const auto t = tokens(40);  // crosses the 32-token chunk boundary
  const size_t V = size_t(s->n_vocab());
  const auto all = s->prefill_all(t);
  ASSERT_EQ(all.size(), t.size() * V);
  s->rewind(0);
  std::vector<float> row = s->prefill(std::span<const int32_t>(t.data(), 1));
  double worst = 0.0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (i > 0) s->decode(t[i], row);
    for (size_t j = 0; j < V; ++j)
      worst = std::max(worst, double(std::abs(all[i * V + j] - row[j])));
  }
  RecordProperty("max_abs_prefill_vs_decode", std::to_string(worst));
  EXPECT_LE(worst, 1e-4);
  const auto last = s->prefill(std::span<const int32_t>(t.data(), 1));  // position 40: still fine
  EXPECT_EQ(s->position(), 41);
}

TEST_P(SessionTest, RejectsBadArguments) {
  auto s = open(8);
  std::vector<float> row(size_t(s->n_vocab()));
  try {
    s->decode(s->n_vocab(), row);
    ADD_FAILURE() << "token id n_vocab accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_INVALID_ARGUMENT);
  }
  s->prefill(tokens(8));
  try {
    s->decode(1, row);
    ADD_FAILURE() << "decode past max_context accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_CONTEXT_FULL);
  }
  try {
    s->rewind(9);
    ADD_FAILURE() << "rewind past position accepted";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_INVALID_ARGUMENT);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, SessionTest,
                         ::testing::Values(TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED),
                         [](const auto& param_info) {
                           return param_info.param == TS_WEIGHTS_QUANTIZED ? "quantized"
                                                                           : "full_precision";
                         });

}  // namespace
}  // namespace touchstone
