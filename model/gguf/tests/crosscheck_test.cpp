// crosscheck_test.cpp - compares dequantize_row() with values produced by the
// reference Python implementation (gguf-py `gguf.quants.dequantize`), stored in
// tests/data/quant_crosscheck.txt by tests/gen_crosscheck.py.
#include <bit>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "touchstone/model/quant.h"

namespace touchstone::gguf {
namespace {

struct Case {
  std::string kind;  // "type" or "model"
  std::string name;  // type name or tensor name
  uint32_t type = 0;
  std::vector<uint8_t> bytes;
  std::vector<uint32_t> bits;
};

std::vector<Case> load_cases() {
  std::ifstream in(std::string(TOUCHSTONE_GGUF_TESTDATA_DIR) + "/quant_crosscheck.txt");
  EXPECT_TRUE(in.good()) << "missing " << TOUCHSTONE_GGUF_TESTDATA_DIR << "/quant_crosscheck.txt";
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string tag;
    ls >> tag;
    if (tag == "type" || tag == "model") {
      Case c;
      c.kind = tag;
      ls >> c.name;
      if (tag == "type") ls >> c.type;
      cases.push_back(std::move(c));
    } else if (tag == "bytes" && !cases.empty()) {
      std::string hex;
      ls >> hex;
      for (size_t i = 0; i + 1 < hex.size(); i += 2)
        cases.back().bytes.push_back(
            static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
    } else if (tag == "values" && !cases.empty()) {
      std::string v;
      while (ls >> v)
        cases.back().bits.push_back(static_cast<uint32_t>(std::stoul(v, nullptr, 16)));
    }
  }
  return cases;
}

void expect_same(const std::vector<float>& got, const std::vector<uint32_t>& want,
                 const std::string& what) {
  ASSERT_GE(got.size(), want.size()) << what;
  int mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float w = std::bit_cast<float>(want[i]);
    // Bit-exact, except that -0 and +0 compare equal.
    if (got[i] != w || std::isnan(got[i]) != std::isnan(w)) {
      if (++mismatches <= 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << w;
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

TEST(CrossCheck, AgainstGgufPy) {
  const auto cases = load_cases();
  int n_types = 0;
  for (const Case& c : cases) {
    if (c.kind != "type") continue;
    ++n_types;
    const auto t = static_cast<TensorType>(c.type);
    ASSERT_EQ(type_name(t), c.name);
    const TypeTraits& tt = type_traits(t);
    ASSERT_EQ(c.bytes.size() / tt.type_size * tt.block_size, c.bits.size()) << c.name;
    std::vector<float> y(c.bits.size());
    dequantize_row(t, c.bytes.data(), y.data(), static_cast<int64_t>(y.size()));
    expect_same(y, c.bits, c.name);
  }
  EXPECT_GE(n_types, 12);
}

TEST(CrossCheck, RealModelAgainstGgufPy) {
  const char* path = std::getenv("TOUCHSTONE_MODEL");
  if (path == nullptr)
    GTEST_SKIP() << "TOUCHSTONE_MODEL is not set; skipping the real-model cross-check";
  const File f = File::open(path);
  int n = 0;
  for (const Case& c : load_cases()) {
    if (c.kind != "model") continue;
    ++n;
    expect_same(dequantize(f, f.tensor(c.name)), c.bits, c.name);
  }
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace touchstone::gguf
