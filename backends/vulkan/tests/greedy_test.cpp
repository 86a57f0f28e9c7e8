// greedy_test.cpp - Forward::greedy (argmax on the device) against the host
// argmax of the logits that Forward::run returns, on the real model, both
// weight paths; and argmax.comp alone on ties and NaN. SKIPs without a Vulkan
// device or without the model file.
#include <gtest/gtest.h>

#include "touchstone/test_model.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "touchstone/metrics/metrics.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/llama_config.h"
#include "vk_buffer.h"
#include "vk_context.h"
#include "vk_forward.h"
#include "vk_kernels.h"
#include "vk_weights.h"

namespace touchstone::vk {
namespace {

std::string model_path() { return touchstone::test::real_model_path(); }

// nullptr and the reason when there is no Vulkan device.
std::shared_ptr<Context> context_or_skip(std::string* why) {
  try {
    return Context::create();
  } catch (const abi::StatusError& e) {
    if (e.status() != TS_ERR_DEVICE) throw;
    *why = e.what();
    return nullptr;
  }
}

// The harness's rule: lowest index among the maxima, NaN skipped,
// metrics::kNoToken (-1) when all NaN.
int32_t host_argmax(const float* x, size_t n) { return metrics::argmax({x, n}); }

TEST(ArgmaxKernelTest, TiesGoToLowestIndexAndNanIsSkipped) {
  std::string why;
  auto ctx = context_or_skip(&why);
  if (!ctx) GTEST_SKIP() << "no Vulkan device: " << why;
  Kernels kernels(*ctx);
  DescriptorCache sets(*ctx);
  const uint32_t n = 1000, off = 24;
  std::vector<float> x(off + n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  x[off + 5] = NAN;
  x[off + 700] = 7.0f;  // tie: 300 must win
  x[off + 300] = 7.0f;
  x[3] = 9.0f;  // before off: ignored
  auto run = [&](const std::vector<float>& v) {
    Buffer X(*ctx, v.size() * 4, Buffer::Kind::Host), R(*ctx, 4, Buffer::Kind::Host);
    X.upload(v.data(), v.size() * 4);
    ctx->run([&](VkCommandBuffer cb) {
      Recorder r(cb, sets);
      r.dispatch(kernels.argmax(), {&X, &R}, ArgmaxPush{n, off}, 1);
      r.host_barrier();
    });
    int32_t got = 0;
    std::memcpy(&got, R.mapped(), 4);
    return got;
  };
  EXPECT_EQ(run(x), 300);
  EXPECT_EQ(run(x), host_argmax(x.data() + off, n));
  std::vector<float> nan(off + n, NAN);
  EXPECT_EQ(run(nan), -1);
  ctx->check_validation();
}

class GreedyTest : public ::testing::TestWithParam<bool> {};  // param: quantized

TEST_P(GreedyTest, MatchesHostArgmaxOfLogits) {
  if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "model not found: " << model_path();
  std::string why;
  auto ctx = context_or_skip(&why);
  if (!ctx) GTEST_SKIP() << "no Vulkan device: " << why;
  const gguf::File file = gguf::File::open(model_path());
  const ModelConfig config = read_llama_config(file);
  Kernels kernels(*ctx);
  auto weights = upload_weights(*ctx, file, config, GetParam());
  Forward a(*ctx, kernels, *weights, 128, Faults{}), b(*ctx, kernels, *weights, 128, Faults{});
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back(100 + 53 * i);  // crosses a 32-token chunk
  std::vector<float> logits(size_t(a.n_vocab()));
  a.prefill(prompt.data(), int32_t(prompt.size()), false, logits.data());
  int32_t want = host_argmax(logits.data(), logits.size());
  int32_t got = b.prefill_greedy(prompt.data(), int32_t(prompt.size()));
  EXPECT_EQ(got, want) << "after the prompt";
  for (int step = 0; step < 4; ++step) {  // greedy decoding: feed the token back
    a.prefill(&want, 1, false, logits.data());
    const int32_t next_want = host_argmax(logits.data(), logits.size());
    got = b.prefill_greedy(&want, 1);
    EXPECT_EQ(got, next_want) << "decode step " << step;
    want = next_want;
  }
  EXPECT_EQ(a.position(), b.position());
  ctx->check_validation();
}

INSTANTIATE_TEST_SUITE_P(Paths, GreedyTest, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "quantized" : "full_precision"; });

}  // namespace
}  // namespace touchstone::vk
