// SimdModel frees the file's bytes once the quantized matrices are in its arena
// (release_file): the embedding still reads the same rows, the full-precision path
// reads the file again and equals the dequantized tensors, and a file that changed
// since the load is refused rather than read. gguf::File::discard_pages, which the
// relocation uses to hold one copy of the weights during the load, drops exactly the
// whole pages inside the range it is given.
#include <gtest/gtest.h>

#include <unistd.h>

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

TEST(ReleaseFile, DiscardPagesDropsOnlyTheWholePagesInside) {
  gg::File f = gg::File::open(kModel);
  const gg::TensorInfo* big = nullptr;
  for (const gg::TensorInfo& t : f.tensors())
    if (!big || f.tensor_data(t).size() > f.tensor_data(*big).size()) big = &t;
  ASSERT_NE(big, nullptr);
  const std::span<const uint8_t> d = f.tensor_data(*big);
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  ASSERT_GT(d.size(), 3 * page) << big->name;
  const std::vector<uint8_t> before(d.begin(), d.end());
  // A range that starts and ends mid-page: its whole pages read as zeros afterwards,
  // the partial pages at both ends keep their bytes.
  const size_t b = page / 2, e = d.size() - page / 2;
  f.discard_pages(d.subspan(b, e - b));
  const uintptr_t base = reinterpret_cast<uintptr_t>(d.data());
  const size_t first = size_t((base + b + page - 1) / page * page - base);
  const size_t last = size_t((base + e) / page * page - base);
  ASSERT_LT(first, last);
  for (size_t i = 0; i < d.size(); ++i) {
    if (i >= first && i < last)
      ASSERT_EQ(d[i], 0) << i;
    else
      ASSERT_EQ(d[i], before[i]) << i;
  }
  // A range outside the file's bytes is ignored.
  const std::vector<uint8_t> other(4 * page, 1);
  f.discard_pages(other);
  EXPECT_EQ(other[2 * page], 1);
}

}  // namespace
