// Weights kept as stored (touchstone/model/weight_matrix.h) give the reference the values
// the dequantized copy gives, bit for bit: every row of every matrix of every converted
// test model (every family and block type in tests/models, the mixture-of-experts and
// gpt-oss ones included) equals load_model_weights()'s, and the logits of a short
// sequence are the same bits with the matrices as stored and expanded to fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
namespace {

namespace fs = std::filesystem;

// Every text model under tests/models (an mmproj, general.architecture "clip", is a
// vision tower's file: model/vision reads those).
std::vector<std::string> test_models() {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(TOUCHSTONE_TEST_MODELS_DIR)) {
    if (e.path().extension() != ".gguf") continue;
    if (gguf::File::open_metadata(e.path().string()).get_string("general.architecture") == "clip")
      continue;
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Every row of m read through row() against the dequantized copy d.
void expect_rows(const WeightMatrix& m, const std::vector<float>& d, const std::string& what) {
  ASSERT_EQ(size_t(m.rows()) * size_t(m.cols()), d.size()) << what;
  std::vector<float> scratch(size_t(m.cols()));
  for (int64_t o = 0; o < m.rows(); ++o) {
    ASSERT_TRUE(same_bits(m.row(o, scratch.data()), d.data() + o * m.cols(), size_t(m.cols())))
        << what << " row " << o;
  }
}

std::vector<std::vector<float>> logits(const StoredWeights& w) {
  ReferenceTransformer ref(w, 16, 2);
  std::vector<std::vector<float>> out;
  for (int32_t t : {1, 5, 2, 9}) {
    out.emplace_back(size_t(w.config.n_vocab));
    ref.forward(t % w.config.n_vocab, out.back());
  }
  return out;
}

void expect_stored_rows(const std::string& path) {
  const gguf::File file = gguf::File::open(path);
  const ModelWeights d = load_model_weights(file);
  const StoredWeights s = load_stored_weights(path);
  ASSERT_TRUE(s.file);
  expect_rows(s.token_embd, d.token_embd, "token_embd");
  if (!d.output.empty()) expect_rows(s.output, d.output, "output");
  for (size_t l = 0; l < d.layers.size(); ++l) {
    const LayerWeights& D = d.layers[l];
    const StoredLayerWeights& S = s.layers[l];
    const std::pair<const WeightMatrix*, const std::vector<float>*> pairs[] = {
        {&S.wq, &D.wq},
        {&S.wk, &D.wk},
        {&S.wv, &D.wv},
        {&S.wo, &D.wo},
        {&S.w_gate, &D.w_gate},
        {&S.w_up, &D.w_up},
        {&S.w_down, &D.w_down},
        {&S.ffn_gate_inp, &D.ffn_gate_inp},
        {&S.gate_exps, &D.gate_exps},
        {&S.up_exps, &D.up_exps},
        {&S.down_exps, &D.down_exps}};
    for (size_t i = 0; i < std::size(pairs); ++i) {
      ASSERT_EQ(pairs[i].first->empty(), pairs[i].second->empty()) << "layer " << l << " #" << i;
      if (!pairs[i].second->empty())
        expect_rows(*pairs[i].first, *pairs[i].second, "layer " + std::to_string(l));
    }
    EXPECT_EQ(S.attn_norm, D.attn_norm);
  }
}

void expect_same_logits(const std::string& path) {
  const StoredWeights stored = load_stored_weights(path);
  StoredWeights fp32 = load_stored_weights(path);
  expand_to_fp32(fp32);
  EXPECT_FALSE(fp32.file) << "the file is released once every matrix is expanded";
  EXPECT_EQ(fp32.token_embd.type(), gguf::TensorType::F32);
  const auto a = logits(stored), b = logits(fp32);
  for (size_t p = 0; p < a.size(); ++p)
    EXPECT_TRUE(same_bits(a[p].data(), b[p].data(), a[p].size())) << "position " << p;
}

// One test over every file (61 files, well under a second): a test per file would
// cost a process start each under CTest.
TEST(Residency, StoredRowsAreTheDequantizedValues) {
  const std::vector<std::string> models = test_models();
  ASSERT_GT(models.size(), 40u) << TOUCHSTONE_TEST_MODELS_DIR;
  for (const std::string& m : models) {
    SCOPED_TRACE(m);
    expect_stored_rows(m);
  }
}

TEST(Residency, StoredAndFp32GiveTheSameLogits) {
  for (const std::string& m : test_models()) {
    SCOPED_TRACE(m);
    expect_same_logits(m);
  }
}

TEST(WeightMatrix, RefusesPartialBlocksAndOutOfRangeSlices) {
  const std::vector<uint8_t> bytes(34 * 4, 0);  // four Q8_0 blocks
  EXPECT_THROW(WeightMatrix(gguf::TensorType::Q8_0, bytes.data(), 2, 48), Error);
  const WeightMatrix m(gguf::TensorType::Q8_0, bytes.data(), 2, 64);
  EXPECT_EQ(m.row_bytes(), 68u);
  EXPECT_EQ(m.slice(1, 1).data(), bytes.data() + 68);
  EXPECT_THROW(m.slice(1, 2), Error);
  EXPECT_THROW(m.slice(-1, 1), Error);
}

}  // namespace
}  // namespace touchstone
