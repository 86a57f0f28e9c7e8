// Shared helpers of the golden-file tests: sample goldens, file helpers and
// the GoldenTest fixture (a fresh temp directory per test).
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"

namespace golden_testing {

namespace fs = std::filesystem;
using touchstone::Error;
using touchstone::GoldenCase;
using touchstone::GoldenFile;
using touchstone::GoldenScoring;

inline float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
// memcmp of two equal-size vectors (no null pointers for empty ones).
template <typename T>
inline bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

inline GoldenCase make_case(std::mt19937& rng, const std::string& name, int32_t vocab, int32_t k,
                            size_t p, size_t g, int32_t f) {
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  GoldenCase c;
  c.name = name;
  c.n_vocab = vocab;
  c.top_k = k;
  c.n_full_steps = f;
  for (size_t i = 0; i < p; ++i) c.prompt_ids.push_back(id(rng));
  for (size_t i = 0; i < g; ++i) c.greedy_ids.push_back(id(rng));
  for (size_t i = 0; i < static_cast<size_t>(f) * static_cast<size_t>(vocab); ++i)
    c.full_logits.push_back(logit(rng));
  for (size_t i = 0; i < g * static_cast<size_t>(k); ++i) {
    c.topk_ids.push_back(id(rng));
    c.topk_logits.push_back(logit(rng));
  }
  for (size_t i = 0; i < g; ++i) c.lse.push_back(static_cast<double>(logit(rng)) * 1.000001);
  return c;
}

inline GoldenFile make_golden(unsigned seed = 42) {
  std::mt19937 rng(seed);
  GoldenFile g;
  g.model_name = "smollm2-135m-instruct-q4_1";
  g.model_sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
  g.reference_version = "0.1.0";
  g.reference_revision = "abc123-dirty";

  // Deliberately not in alphabetical order: order must survive a round trip.
  GoldenCase zeta = make_case(rng, "zeta", 50, 5, 6, 8, 3);
  zeta.prompt_text = "Once upon a time";
  zeta.greedy_text = std::string("ok \xff\xfe\x00 \xc3(", 9);  // invalid UTF-8 + NUL
  // Special bit patterns.
  zeta.full_logits[0] = std::numeric_limits<float>::quiet_NaN();
  zeta.full_logits[1] = from_bits(0x7fc01234u);  // NaN with payload
  zeta.full_logits[2] = from_bits(0xffc00001u);  // negative NaN
  zeta.full_logits[3] = std::numeric_limits<float>::infinity();
  zeta.full_logits[4] = -std::numeric_limits<float>::infinity();
  zeta.full_logits[5] = -0.0f;
  zeta.full_logits[6] = std::numeric_limits<float>::denorm_min();
  zeta.topk_logits[0] = -0.0f;
  zeta.lse[0] = std::numeric_limits<double>::quiet_NaN();
  zeta.lse[1] = -0.0;
  g.cases.push_back(zeta);

  GoldenCase alpha = make_case(rng, "alpha", 50, 5, 3, 4, 4);
  alpha.chat = true;
  alpha.prompt_text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  alpha.greedy_text = "Hello!";
  g.cases.push_back(alpha);

  // Everything empty: empty prompt, no greedy tokens, F = 0.
  GoldenCase empty = make_case(rng, "empty-prompt", 7, 0, 0, 0, 0);
  g.cases.push_back(empty);

  // Larger case so full_logits spans several compressed chunks.
  g.cases.push_back(make_case(rng, "big.case", 20000, 10, 5, 6, 6));

  GoldenScoring s;
  s.name = "passage";
  s.text = "The quick brown fox jumps over the lazy dog.";
  s.n_vocab = 50;
  s.top_k = 4;
  std::uniform_int_distribution<int32_t> id(0, 49);
  for (int i = 0; i < 10; ++i) s.token_ids.push_back(id(rng));
  for (int i = 0; i < 9 * 4; ++i) {
    s.topk_ids.push_back(id(rng));
    s.topk_logits.push_back(static_cast<float>(i) * 0.25f - 3.0f);
  }
  for (int i = 0; i < 9; ++i) {
    s.lse.push_back(1.0 / (i + 1));
    s.target_logits.push_back(static_cast<float>(-i));
  }
  g.scoring.push_back(s);

  GoldenScoring single;
  single.name = "one-token";
  single.text = "x";
  single.n_vocab = 50;
  single.top_k = 4;
  single.token_ids = {3};
  g.scoring.push_back(single);
  return g;
}

// A case whose full_logits take about `bytes` bytes (incompressible enough).
inline GoldenCase make_case_for_size(unsigned seed, size_t bytes) {
  std::mt19937 rng(seed);
  const int32_t vocab = 4096;
  const auto rows = static_cast<int32_t>(std::max<size_t>(1, bytes / (4 * vocab)));
  return make_case(rng, "large", vocab, 4, 4, static_cast<size_t>(rows), rows);
}

inline std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

inline void spit(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Zeroes the checksum header (user block): a file as another tool writes it.
inline void strip_checksum(const std::string& p) {
  std::string b = slurp(p);
  b.replace(0, 512, std::string(512, '\0'));
  spit(p, b);
}

// Re-stamps a valid header so that a file edited with the HDF5 API reaches
// the structural checks instead of failing the checksum.
inline void restamp(const std::string& p) { spit(p, touchstone::stamp_golden_header(slurp(p))); }

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("touchstone_golden_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a valid golden file, then lets `edit` break it with the HDF5 API.
  std::string broken(const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string p = path(name);
    touchstone::write_golden_file(p, make_golden());
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT_GE(f, 0);
    edit(f);
    EXPECT_GE(H5Fclose(f), 0);
    restamp(p);
    return p;
  }

  // Expects read_golden_file to throw an Error mentioning the file and all `parts`.
  void expect_read_error(const std::string& p, const std::vector<std::string>& parts) {
    try {
      touchstone::read_golden_file(p);
      ADD_FAILURE() << "no error reading " << p;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  }

  std::vector<std::string> leftovers() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".tmp") != std::string::npos)
        out.push_back(e.path().string());
    return out;
  }

  fs::path dir_;
};

}  // namespace golden_testing
