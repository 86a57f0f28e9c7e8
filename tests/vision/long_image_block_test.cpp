// long_image_block_test.cpp - an image block longer than a backend's forward pass
// (ABI v8 prefill_embeddings, bidirectional) against the reference.
//
// A released Gemma 3 image is 256 tokens attended as one bidirectional block; the
// in-tree backends run prefill in passes of fewer rows (cpu_simd 128, vulkan 32,
// static_graph buckets of 16 / 64), so the block must still be one pass there (each row
// reads every other row's K/V in every layer: splitting it changes the numbers). On the
// vision test model (tests/models/vision, n_embd 64): 3 tokens, a 200-row block of
// deterministic rows, 4 tokens, every position's logits against the reference's,
// NMSE <= 1e-10, where attending the block causally or split at row 128 moves them by
// more than 1e-6. A backend not built SKIPs, naming it; so does vulkan without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/metrics/metrics.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

const std::string kModel = TOUCHSTONE_TEST_MODEL_DIR "/vision/gemma3vl-test-f32.gguf";
constexpr int32_t kRows = 200, kCtx = 256;
const std::vector<int32_t> kBefore = {2, 9, 3}, kAfter = {4, 11, 7, 8};

// metrics::nmse with the reference first.
double nmse(const std::vector<float>& x, const std::vector<float>& ref) {
  return metrics::nmse(ref, x);
}

struct Lib {
  std::shared_ptr<BackendLibrary> lib;
  std::unique_ptr<BackendModel> model;
};

// Every position's logits: kBefore, the rows (as blocks of `split` rows; 0 = one block),
// kAfter.
std::vector<float> run(const Lib& l, ts_weight_path path, const std::vector<float>& rows, int32_t d,
                       bool bidirectional, int32_t split = 0) {
  BackendSessionOptions o;
  o.weight_path = path;
  o.n_threads = 2;
  o.max_context = kCtx;
  BackendSession s(*l.model, o);
  std::vector<float> out = s.prefill_all(kBefore);
  const int32_t n = int32_t(rows.size() / size_t(d)), step = split > 0 ? split : n;
  for (int32_t i = 0; i < n; i += step) {
    const int32_t m = std::min(step, n - i);
    const std::vector<float> r = s.prefill_embeddings(
        std::span<const float>(rows.data() + size_t(i) * size_t(d), size_t(m) * size_t(d)), d,
        bidirectional, true);
    out.insert(out.end(), r.begin(), r.end());
  }
  const std::vector<float> after = s.prefill_all(kAfter);
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

Lib open(const std::string& path) {
  Lib l;
  l.lib = BackendLibrary::load(path);
  l.model = std::make_unique<BackendModel>(l.lib, kModel);
  return l;
}

class LongImageBlock : public ::testing::TestWithParam<std::string> {};

TEST_P(LongImageBlock, IsOnePassEqualToTheReference) {
  const std::string path = GetParam();
  if (path.empty() || !std::filesystem::exists(path)) GTEST_SKIP() << "backend not built";
  Lib backend;
  try {
    backend = open(path);
  } catch (const BackendError& e) {
    if (e.status() == TS_ERR_DEVICE) GTEST_SKIP() << "no device: " << e.what();
    throw;
  }
  const Lib ref = open(TOUCHSTONE_REFERENCE_LIB);
  ASSERT_TRUE(backend.lib->has_embeddings());
  const int32_t d = 64;
  std::vector<float> rows(size_t(kRows) * d);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = float(std::sin(0.37 * double(i)));
  const std::vector<float> want = run(ref, TS_WEIGHTS_FULL_PRECISION, rows, d, true);
  ASSERT_GT(nmse(run(ref, TS_WEIGHTS_FULL_PRECISION, rows, d, false), want), 1e-6);
  ASSERT_GT(nmse(run(ref, TS_WEIGHTS_FULL_PRECISION, rows, d, true, 128), want), 1e-6);
  for (ts_weight_path p : {TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED}) {
    SCOPED_TRACE(p == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision");
    EXPECT_LT(nmse(run(backend, p, rows, d, true), want), 1e-10);
  }
}

// "cpu_simd" from ".../libtouchstone_backend_cpu_simd.so"; "not_built_N" for "".
std::string backend_name(const ::testing::TestParamInfo<std::string>& p) {
  const std::string prefix = "libtouchstone_backend_";
  const size_t b = p.param.find(prefix);
  if (b == std::string::npos) return "not_built_" + std::to_string(p.index);
  return p.param.substr(b + prefix.size(), p.param.size() - b - prefix.size() - 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, LongImageBlock,
                         ::testing::Values(TOUCHSTONE_CPU_SIMD_LIB, TOUCHSTONE_VULKAN_LIB,
                                           TOUCHSTONE_STATIC_GRAPH_LIB),
                         backend_name);

}  // namespace
}  // namespace touchstone
