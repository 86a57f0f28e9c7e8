// gguf_truncate_test.cpp - a GGUF file truncated (or rewritten) by someone
// else while it is open must not crash the reader: File::open reads the file
// into memory, so tensor data stays valid (with the old mmap() reader the
// accesses below died of SIGBUS), and a file that delivers fewer bytes than
// its size while being read is an ordinary Error.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "gguf_builder.h"
#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"

namespace touchstone::gguf {
namespace {

using testing::GgufBuilder;
using testing::TempFile;

// Two F32 tensors of 64 KiB each, so their data lies on pages well past the
// header and the first page.
std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale;
  return v;
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(GgufTruncate, TensorDataSurvivesTruncationAfterOpen) {
  constexpr size_t kN = 16384;
  const std::vector<float> a = values(kN, 0.5f), b = values(kN, -0.25f);
  GgufBuilder g;
  g.key("general.architecture", ValueType::STRING).str("llama");
  g.tensor("a", {kN}, TensorType::F32, bytes_of(a));
  g.tensor("b", {kN}, TensorType::F32, bytes_of(b));
  TempFile tmp(g.build(), "truncate");

  const File f = File::open(tmp.path());
  ASSERT_EQ(::truncate(tmp.path().c_str(), 0), 0) << std::strerror(errno);
  struct stat st {};
  ASSERT_EQ(::stat(tmp.path().c_str(), &st), 0);
  ASSERT_EQ(st.st_size, 0);  // the file on disk is gone; what we opened is not

  EXPECT_EQ(dequantize(f, f.tensor("a")), a);
  EXPECT_EQ(dequantize(f, f.tensor("b")), b);
  const auto raw = f.tensor_data(f.tensor("b"));
  ASSERT_EQ(raw.size(), kN * sizeof(float));
  EXPECT_EQ(std::memcmp(raw.data(), bytes_of(b).data(), raw.size()), 0);
}

TEST(GgufTruncate, TensorDataSurvivesRewriteAfterOpen) {
  const std::vector<float> a = values(1024, 2.0f);
  GgufBuilder g;
  g.tensor("a", {1024}, TensorType::F32, bytes_of(a));
  TempFile tmp(g.build(), "rewrite");
  const File f = File::open(tmp.path());
  {  // overwrite in place with a shorter, different file
    std::ofstream out(tmp.path(), std::ios::binary | std::ios::trunc);
    out << "GGUF but not really";
  }
  EXPECT_EQ(dequantize(f, f.tensor("a")), a);
}

// A regular file whose size says more than it delivers: sysfs attributes
// report 4096 bytes and return a few. Reading it must end in an Error naming
// the file and the offset where the bytes ran out, as a file truncated while
// being read would.
TEST(GgufTruncate, FileShorterThanItsSizeIsAnError) {
  const char* path = "/sys/kernel/uevent_seqnum";
  struct stat st {};
  if (::stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 64)
    GTEST_SKIP() << path << " is not a sysfs file reporting a page-sized length here";
  try {
    (void)File::open(path);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("file shrank while being read"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset "), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace touchstone::gguf
