// SimdModel frees the file's bytes once the quantized matrices are in its arena
// (release_file): the embedding still reads the same rows, the full-precision path
// reads the file again and equals the dequantized tensors, and a file that changed
// since the load is refused rather than read.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_weights.h"

namespace {

namespace gg = touchstone::gguf;
using touchstone::cpu_simd::SimdModel;

const std::string kModel = std::string(TOUCHSTONE_TEST_MODEL_DIR) + "/llama-test-q8_0.gguf";

std::vector<char> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(ReleaseFile, EmbeddingAndFullPrecisionAfterTheFileIsFreed) {
  const SimdModel probe(kModel);
  const touchstone::ModelWeights w = touchstone::load_model_weights(gg::File::open(kModel));
  SimdModel m(kModel);
  const size_t d = size_t(w.config.n_embd);
  std::vector<float> row(d);
  for (int32_t t : {0, 7, w.config.n_vocab - 1}) {
    m.embed(t, false, row.data());
    EXPECT_EQ(0, std::memcmp(row.data(), w.token_embd.data() + size_t(t) * d, d * 4)) << t;
  }
  const auto& fp = m.full_precision();
  ASSERT_EQ(fp.layers.size(), w.layers.size());
  EXPECT_EQ(0, std::memcmp(fp.layers[0].wq.f, w.layers[0].wq.data(), w.layers[0].wq.size() * 4));
}

TEST(ReleaseFile, AChangedFileIsRefusedByTheFullPrecisionPath) {
  const std::string copy = ::testing::TempDir() + "release_file_model.gguf";
  const std::vector<char> original = bytes_of(kModel);
  std::ofstream(copy, std::ios::binary).write(original.data(), std::streamsize(original.size()));
  SimdModel m(copy);
  std::ofstream(copy, std::ios::binary | std::ios::trunc)
      .write(original.data(), std::streamsize(original.size() / 2));
  try {
    (void)m.full_precision();
    ADD_FAILURE() << "a truncated file was read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(copy), std::string::npos) << e.what();
  }
  std::remove(copy.c_str());
}

}  // namespace
