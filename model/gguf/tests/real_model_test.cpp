// real_model_test.cpp - reads the real SmolLM2-135M-Instruct Q4_1 GGUF when
// TOUCHSTONE_MODEL points at it (e.g.
// /root/.cache/touchstone/models/SmolLM2-135M-Instruct.Q4_1.gguf).
#include <cmath>
#include <cstdlib>
#include <map>

#include <gtest/gtest.h>

#include "touchstone/model/quant.h"

namespace touchstone::gguf {
namespace {

std::string model_path() {
  const char* p = std::getenv("TOUCHSTONE_MODEL");
  return p == nullptr ? std::string() : std::string(p);
}

void expect_all_finite(const std::vector<float>& v, const std::string& what) {
  size_t bad = 0;
  double sum_abs = 0;
  for (float x : v) {
    if (!std::isfinite(x))
      ++bad;
    else
      sum_abs += std::fabs(x);
  }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_GT(sum_abs, 0.0) << what << " is all zeros";
}

TEST(RealModel, SmolLM2) {
  const std::string path = model_path();
  if (path.empty()) GTEST_SKIP() << "TOUCHSTONE_MODEL is not set; skipping the real-model test";
  const File f = File::open(path);

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count"), 30u);
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), 49152u);
  ASSERT_EQ(f.tensors().size(), 272u);

  std::map<TensorType, int> types;
  for (const TensorInfo& t : f.tensors()) {
    ++types[t.type];
    EXPECT_EQ(f.tensor_data(t).size(), t.n_bytes);
  }
  for (const auto& [type, count] : types) {
    EXPECT_TRUE(type == TensorType::Q4_1 || type == TensorType::F32 || type == TensorType::Q8_0)
        << "unexpected type " << type_name(type) << " x" << count;
  }

  const TensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, TensorType::Q8_0);
  EXPECT_EQ(emb.shape, (std::vector<uint64_t>{576, 49152}));
  const auto e = dequantize(f, emb);
  ASSERT_EQ(e.size(), 576u * 49152u);
  expect_all_finite(e, "token_embd.weight");

  const TensorInfo& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, TensorType::Q4_1);
  EXPECT_EQ(q.shape, (std::vector<uint64_t>{576, 576}));
  expect_all_finite(dequantize(f, q), "blk.0.attn_q.weight");

  const TensorInfo& norm = f.tensor("output_norm.weight");
  EXPECT_EQ(norm.type, TensorType::F32);
  expect_all_finite(dequantize(f, norm), "output_norm.weight");
}

}  // namespace
}  // namespace touchstone::gguf
