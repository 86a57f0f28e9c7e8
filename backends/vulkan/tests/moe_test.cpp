// moe_test.cpp - the built libtouchstone_backend_vulkan.so on the converted
// mixture-of-experts test models (tests/models/moe: Mixtral-style, Qwen3-MoE, Qwen2-MoE
// with its shared expert; tests/models/gpt-oss), through the harness loader, on both
// weight paths:
//   * step_batch == each session alone, bitwise (the TS_CAP_BATCH_INVARIANT claim:
//     a row's routing, expert matmuls and weighted sum do not depend on the other
//     rows of a pass, src/vk_moe.cpp), with entries of different lengths that
//     share experts within one pass;
//   * prefill of 40 tokens (two passes of 32 rows, every expert grouped over many
//     rows) == one-token decode, bitwise (the same claim within one sequence);
//   * expert slabs (src/vk_experts.cpp): parts never cross a slab's end, start
//     aligned, cover every expert's rows in order.
// The logits against the reference's goldens: CTests testmodel.vulkan.*.<moe model>.
// SKIPs without a Vulkan device.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "touchstone/runtime/backend.h"
#include "vk_weights.h"

namespace touchstone {
namespace {

std::string moe_model(const std::string& name) {
  const std::string dir =
      std::string(TOUCHSTONE_MOE_MODEL_DIR) + (name.starts_with("gptoss-") ? "/../gpt-oss/" : "/");
  return dir + name + ".gguf";
}

std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((7 + 37 * i + 101 * seed) % 500 + 3);
  return t;
}

using Param = std::tuple<std::string, ts_weight_path>;

class MoeTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    lib_ = BackendLibrary::load(TOUCHSTONE_VULKAN_LIB);
    try {
      model_ = std::make_unique<BackendModel>(lib_, moe_model(std::get<0>(GetParam())));
    } catch (const BackendError& e) {
      if (e.status() == TS_ERR_DEVICE) GTEST_SKIP() << "no Vulkan device: " << e.what();
      throw;
    }
  }
  std::unique_ptr<BackendSession> open() {
    BackendSessionOptions o;
    o.weight_path = std::get<1>(GetParam());
    o.max_context = 128;
    return std::make_unique<BackendSession>(*model_, o);
  }
  std::shared_ptr<BackendLibrary> lib_;
  std::unique_ptr<BackendModel> model_;
};

TEST_P(MoeTest, StepBatchEqualsEachSessionAlone) {
  const std::vector<std::vector<int32_t>> prompt = {tokens(5, 0), tokens(13, 1), tokens(1, 2)};
  const std::vector<int32_t> next = {11, 47, 301};
  const size_t V = size_t(open()->n_vocab());
  // Alone: the prompt (all positions for entry 1), then one decode step.
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (size_t i = 0; i < prompt.size(); ++i) {
    auto s = open();
    alone_prefill.push_back(i == 1 ? s->prefill_all(prompt[i]) : s->prefill(prompt[i]));
    std::vector<float> row(V);
    s->decode(next[i], row);
    alone_decode.push_back(row);
  }
  // Batched: the three prompts in one step_batch (one pass of 19 rows), then the
  // three decode tokens in another.
  std::vector<std::unique_ptr<BackendSession>> s;
  for (size_t i = 0; i < prompt.size(); ++i) s.push_back(open());
  std::vector<std::vector<float>> out(prompt.size());
  std::vector<BackendSession::Step> steps;
  for (size_t i = 0; i < prompt.size(); ++i) {
    out[i].resize(i == 1 ? prompt[i].size() * V : V);
    steps.push_back({s[i].get(), prompt[i], i == 1, out[i]});
  }
  BackendSession::step_batch(steps);
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(out[i], alone_prefill[i]) << "entry " << i;
  steps.clear();
  for (size_t i = 0; i < prompt.size(); ++i) {
    out[i].assign(V, 0.0f);
    steps.push_back({s[i].get(), std::span<const int32_t>(&next[i], 1), false, out[i]});
  }
  BackendSession::step_batch(steps);
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(out[i], alone_decode[i]) << "decode " << i;
}

TEST_P(MoeTest, PrefillEqualsDecodeBitwise) {
  auto s = open();
  const std::vector<int32_t> t = tokens(40, 3);  // two passes: 32 + 8 rows
  const size_t V = size_t(s->n_vocab());
  const std::vector<float> all = s->prefill_all(t);
  s->rewind(0);
  std::vector<float> row = s->prefill(std::span<const int32_t>(t.data(), 1));
  for (size_t i = 0; i < t.size(); ++i) {
    if (i > 0) s->decode(t[i], row);
    EXPECT_EQ(std::vector<float>(all.begin() + long(i * V), all.begin() + long((i + 1) * V)), row)
        << "position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, MoeTest,
    ::testing::Combine(::testing::Values("mixtral-test-q4_0", "qwen3moe-test-q4_k",
                                         "qwen2moe-test-q5_k", "gptoss-test-mxfp4"),
                       ::testing::Values(TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED)),
    [](const auto& param_info) {
      std::string name =
          std::get<0>(param_info.param) + "_" +
          (std::get<1>(param_info.param) == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision");
      for (char& c : name)
        if (c == '-') c = '_';
      return name;
    });

TEST(MoeSlabs, PartsStayInsideTheirSlabAlignedAndInOrder) {
  vk::DeviceExperts m;
  m.n_out = 10;
  // 10 rows of 100 bytes per expert, at most 4 rows per part, slabs of 1,000 bytes.
  const std::vector<uint64_t> sizes = vk::plan_expert_slabs(m, 5, 4, 100, 1000, 64);
  ASSERT_EQ(m.experts.size(), 5u);
  for (const auto& parts : m.experts) {
    uint32_t row = 0;
    for (const vk::ExpertPart& p : parts) {
      EXPECT_EQ(p.row0, row);
      EXPECT_LE(p.n_rows, 4u);
      EXPECT_EQ(p.bytes, uint64_t{p.n_rows} * 100);
      EXPECT_EQ(p.offset % 64, 0u);
      ASSERT_LT(p.slab, sizes.size());
      EXPECT_LE(p.offset + p.bytes, sizes[p.slab]);
      EXPECT_LE(sizes[p.slab], 1000u);
      row += p.n_rows;
    }
    EXPECT_EQ(row, 10u);
  }
  EXPECT_GT(sizes.size(), 1u);  // 5 x 1,000 bytes of rows do not fit one slab
}

}  // namespace
}  // namespace touchstone
