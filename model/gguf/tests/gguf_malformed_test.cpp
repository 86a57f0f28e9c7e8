// gguf_malformed_test.cpp - malformed files must raise touchstone::Error
// naming the file, the byte offset and the field; never crash.
#include <cstring>

#include <gtest/gtest.h>

#include "gguf_builder.h"
#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"

namespace touchstone::gguf {
namespace {

using testing::Bytes;
using testing::GgufBuilder;
using testing::TempFile;

/// A small valid file with strings, a string array, scalars and two tensors.
std::vector<uint8_t> small_valid_file() {
  GgufBuilder g;
  g.key("general.architecture", ValueType::STRING).str("llama");
  g.key("llama.block_count", ValueType::UINT32).put<uint32_t>(2);
  g.key("f", ValueType::FLOAT32).put<float>(1.5f);
  g.key("b", ValueType::BOOL).put<uint8_t>(0);
  g.key("tok", ValueType::ARRAY).put<uint32_t>(8).put<uint64_t>(2).str("a").str("bc");
  g.key("ids", ValueType::ARRAY).put<uint32_t>(5).put<uint64_t>(2).put<int32_t>(1).put<int32_t>(2);
  g.tensor("w", {2, 2}, TensorType::F32, std::vector<uint8_t>(16, 0));
  std::vector<uint8_t> q(20, 0);
  q[1] = 0x3C;  // d = 1.0
  g.tensor("q", {32}, TensorType::Q4_1, q);
  return g.build();
}

/// The Error message of opener(path), or "" when it opens.
template <class Opener>
std::string error_of(Opener opener, const std::string& path) {
  try {
    (void)opener(path);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

/// Opens `bytes` and returns the Error message (fails the test if none). File::open_metadata
/// must refuse it with the same message (it parses the same header from a prefix).
std::string open_error(const std::vector<uint8_t>& bytes) {
  TempFile tf(bytes, "bad");
  const std::string m = error_of(File::open, tf.path());
  if (m.empty()) {
    ADD_FAILURE() << "no error for a malformed file";
    return {};
  }
  EXPECT_NE(m.find(tf.path()), std::string::npos) << "message lacks the path: " << m;
  EXPECT_EQ(error_of(File::open_metadata, tf.path()), m);
  return m;
}

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  Bytes b;
  b.put<uint32_t>(0x46554747).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  return b;
}

TEST(GgufMalformed, SmallValidFileOpens) {
  TempFile tf(small_valid_file());
  const File f = File::open(tf.path());
  EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
  EXPECT_EQ(dequantize(f, f.tensor("q"))[0], 0.0f);
}

TEST(GgufMalformed, EveryTruncationThrows) {
  const auto bytes = small_valid_file();
  for (size_t len = 0; len < bytes.size(); ++len) {
    TempFile tf(
        std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)),
        "trunc");
    const std::string m = error_of(File::open, tf.path());
    if (m.empty()) ADD_FAILURE() << "prefix of " << len << " bytes opened without error";
    EXPECT_HAS(m, tf.path());
    EXPECT_HAS(m, "offset ");
    EXPECT_EQ(error_of(File::open_metadata, tf.path()), m) << "prefix of " << len << " bytes";
  }
}

TEST(GgufMalformed, CorruptedBytesNeverCrash) {
  // Overwrite each byte with a few nasty values: must open fine or throw Error.
  const auto good = small_valid_file();
  int opened = 0, rejected = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x7F}, uint8_t{0x81}}) {
      auto bytes = good;
      bytes[i] = v;
      // A fresh file each time (rewriting a just-unmapped file is slow on some filesystems).
      TempFile tf(bytes, "fuzz");
      const std::string m = error_of(File::open, tf.path());
      EXPECT_EQ(error_of(File::open_metadata, tf.path()), m) << "byte " << i << " = " << int(v);
      try {
        const File f = File::open(tf.path());
        for (const TensorInfo& t : f.tensors()) {
          if (can_dequantize(t.type)) (void)dequantize(f, t);
        }
        ++opened;
      } catch (const Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(rejected, 0);
}

TEST(GgufMetadataOnly, SameMetadataAndTensorsNoData) {
  // A 3 MB string makes the header outgrow the first prefixes (1 MiB, then 4 MiB).
  GgufBuilder g;
  g.key("big", ValueType::STRING).str(std::string(3 << 20, 'x'));
  g.key("n", ValueType::UINT32).put<uint32_t>(7);
  g.tensor("w", {2, 2}, TensorType::F32, std::vector<uint8_t>(16, 0));
  TempFile tf(g.build());
  const File all = File::open(tf.path());
  const File meta = File::open_metadata(tf.path());
  EXPECT_EQ(meta.file_size(), all.file_size());
  EXPECT_EQ(meta.data_offset(), all.data_offset());
  EXPECT_EQ(meta.get_string("big"), all.get_string("big"));
  EXPECT_EQ(meta.get_uint("n"), 7u);
  ASSERT_EQ(meta.tensors().size(), 1u);
  EXPECT_EQ(meta.tensor("w").offset, all.tensor("w").offset);
  EXPECT_EQ(meta.tensor("w").shape, all.tensor("w").shape);
  EXPECT_EQ(all.tensor_data(all.tensor("w")).size(), 16u);
  EXPECT_THROW((void)meta.tensor_data(meta.tensor("w")), Error);
}

TEST(GgufMalformed, MissingEmptyAndDirectory) {
  EXPECT_THROW(File::open("/nonexistent/dir/model.gguf"), Error);
  EXPECT_THROW(File::open("/"), Error);
  const std::string m = open_error({});
  EXPECT_HAS(m, "offset 0");
  EXPECT_HAS(m, "magic");
}

TEST(GgufMalformed, BadMagic) {
  auto bytes = small_valid_file();
  std::memcpy(bytes.data(), "GGML", 4);
  const std::string m = open_error(bytes);
  EXPECT_HAS(m, "offset 0: header: magic: bad magic");
  EXPECT_HAS(m, "'GGML'");
}

TEST(GgufMalformed, Versions) {
  std::string m = open_error(header(0, 0, 1).b);
  EXPECT_HAS(m, "offset 4: header: version: GGUF version 1 is not supported");
  m = open_error(header(0, 0, 0x03000000).b);
  EXPECT_HAS(m, "big-endian");
  m = open_error(header(0, 0, 7).b);
  EXPECT_HAS(m, "unsupported GGUF version 7");
}

TEST(GgufMalformed, HugeCountsInHeader) {
  std::string m = open_error(header(0, 1ull << 62).b);
  EXPECT_HAS(m, "offset 16: header: metadata key/value count 4611686018427387904 exceeds");
  m = open_error(header(1ull << 40, 0).b);
  EXPECT_HAS(m, "offset 8: header: tensor count 1099511627776 exceeds");
}

TEST(GgufMalformed, HugeKeyLength) {
  Bytes b = header(0, 1);
  b.put<uint64_t>(999999999).put<uint32_t>(0).put<uint64_t>(0);
  const std::string m = open_error(b.b);
  EXPECT_HAS(m,
             "offset 24: metadata key #0: key: string length 999999999 exceeds remaining 12 bytes");
}

TEST(GgufMalformed, HugeStringValueLength) {
  Bytes b = header(0, 2);
  b.str("a").put<uint32_t>(4).put<uint32_t>(1);  // 24 + 9 + 4 + 4 = 41
  b.str("llama.block_count").put<uint32_t>(8).put<uint64_t>(999999999).put<uint32_t>(0);
  const std::string m = open_error(b.b);
  EXPECT_HAS(m,
             "offset 70: metadata key #1 'llama.block_count': string: string length 999999999 "
             "exceeds remaining 4");
}

TEST(GgufMalformed, HugeArrayCount) {
  Bytes b = header(0, 1);
  b.str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 60).put<uint32_t>(1);
  const std::string m = open_error(b.b);
  EXPECT_HAS(m,
             "offset 43: metadata key #0 'arr': array count 1152921504606846976 of UINT32 exceeds "
             "remaining 4 bytes");
}

TEST(GgufMalformed, HugeCountInsideStringArray) {
  Bytes b = header(0, 1);
  b.str("tok").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("ok").put<uint64_t>(1ull
                                                                                          << 50);
  const std::string m = open_error(b.b);
  EXPECT_HAS(m,
             "metadata key #0 'tok' element #1: string: string length 1125899906842624 exceeds "
             "remaining 0");
  EXPECT_HAS(m, "offset 61:");
}

TEST(GgufMalformed, BadValueTypes) {
  Bytes b = header(0, 1);
  b.str("k").put<uint32_t>(13).put<uint32_t>(0);
  EXPECT_HAS(open_error(b.b), "offset 33: metadata key #0 'k': value type: invalid value type 13");

  b = header(0, 1);
  b.str("k").put<uint32_t>(9).put<uint32_t>(99).put<uint64_t>(0);
  EXPECT_HAS(open_error(b.b),
             "offset 37: metadata key #0 'k': array element type: invalid value type 99");

  b = header(0, 1);
  b.str("k").put<uint32_t>(7).put<uint8_t>(2).put<uint32_t>(0);
  EXPECT_HAS(open_error(b.b), "offset 37: metadata key #0 'k': BOOL value: invalid byte 2");
}

TEST(GgufMalformed, NestingTooDeep) {
  Bytes b = header(0, 1);
  b.str("k").put<uint32_t>(9);
  for (int i = 0; i < 10; ++i) b.put<uint32_t>(9).put<uint64_t>(1);
  b.put<uint32_t>(0).put<uint64_t>(0);
  EXPECT_HAS(open_error(b.b), "nested deeper than");
}

TEST(GgufMalformed, DuplicateKeyAndTensor) {
  GgufBuilder g;
  g.key("k", ValueType::UINT8).put<uint8_t>(1);
  g.key("k", ValueType::UINT8).put<uint8_t>(2);
  EXPECT_HAS(open_error(g.build()), "offset 38: metadata key #1 'k': duplicate metadata key");

  GgufBuilder t;
  t.tensor("x", {4}, TensorType::F32, std::vector<uint8_t>(16));
  t.tensor("x", {4}, TensorType::F32, std::vector<uint8_t>(16));
  EXPECT_HAS(open_error(t.build()), "tensor #1 'x': duplicate tensor name");
}

TEST(GgufMalformed, BadAlignment) {
  GgufBuilder g;
  g.key("general.alignment", ValueType::UINT32).put<uint32_t>(48);
  EXPECT_HAS(open_error(g.build()),
             "offset 24: metadata key 'general.alignment': alignment 48 is not a power of two");
  GgufBuilder s;
  s.key("general.alignment", ValueType::STRING).str("32");
  EXPECT_HAS(open_error(s.build()), "expected an unsigned integer (UINT32), found STRING");
}

// Tensor info of the single tensor in a file without metadata starts at 24.
TEST(GgufMalformed, BadNDims) {
  GgufBuilder g;
  g.tensor("t", {1, 1, 1, 1, 1}, TensorType::F32, std::vector<uint8_t>(4));
  EXPECT_HAS(open_error(g.build()), "offset 33: tensor #0 't': n_dims 5 exceeds the maximum of 4");
}

TEST(GgufMalformed, ZeroAndOverflowingDims) {
  GgufBuilder g;
  g.tensor("t", {4, 0}, TensorType::F32, std::vector<uint8_t>(16));
  EXPECT_HAS(open_error(g.build()), "offset 45: tensor #0 't': dimension 1 is zero");

  GgufBuilder o;
  o.tensor("t", {1ull << 40, 1ull << 40}, TensorType::F32, std::vector<uint8_t>(16));
  EXPECT_HAS(open_error(o.build()),
             "offset 45: tensor #0 't': dimension 1 = 1099511627776: element count overflows");
}

TEST(GgufMalformed, RowNotMultipleOfBlock) {
  GgufBuilder g;
  g.tensor("t", {33}, TensorType::Q8_0, std::vector<uint8_t>(68));
  EXPECT_HAS(open_error(g.build()), "offset 45: tensor #0 't': type Q8_0: row length 33");
}

TEST(GgufMalformed, MisalignedOffset) {
  GgufBuilder g;
  g.tensor("t", {4}, TensorType::F32, std::vector<uint8_t>(16));
  g.tensors[0].offset = 4;
  EXPECT_HAS(open_error(g.build()),
             "offset 49: tensor #0 't': data offset 4 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, TensorDataOutOfRange) {
  GgufBuilder g;
  g.tensor("t", {1024}, TensorType::F32, std::vector<uint8_t>(16));
  std::string m = open_error(g.build());
  EXPECT_HAS(m, "offset 24: tensor 't': data [0, +4096) lies outside the data section");

  GgufBuilder h;
  h.tensor("u", {4}, TensorType::F32, std::vector<uint8_t>(16));
  h.tensors[0].offset = 1ull << 62;
  m = open_error(h.build());
  EXPECT_HAS(m, "tensor 'u': data [4611686018427387904, +16) lies outside the data section");
}

}  // namespace
}  // namespace touchstone::gguf
