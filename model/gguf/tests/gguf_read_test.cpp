// gguf_read_test.cpp - a small valid GGUF v3 built in the test and read back.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "gguf_builder.h"
#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"

namespace touchstone::gguf {
namespace {

using testing::GgufBuilder;
using testing::TempFile;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// Every value type once, plus arrays (of strings, ints, floats, nested).
GgufBuilder full_builder() {
  GgufBuilder g;
  g.key("general.architecture", ValueType::STRING).str("llama");
  g.key("u8", ValueType::UINT8).put<uint8_t>(200);
  g.key("i8", ValueType::INT8).put<int8_t>(-100);
  g.key("u16", ValueType::UINT16).put<uint16_t>(60000);
  g.key("i16", ValueType::INT16).put<int16_t>(-30000);
  g.key("u32", ValueType::UINT32).put<uint32_t>(4000000000u);
  g.key("i32", ValueType::INT32).put<int32_t>(-2000000000);
  g.key("f32", ValueType::FLOAT32).put<float>(0.15625f);
  g.key("bool", ValueType::BOOL).put<uint8_t>(1);
  g.key("u64", ValueType::UINT64).put<uint64_t>(18000000000000000000ull);
  g.key("i64", ValueType::INT64).put<int64_t>(-9000000000000000000ll);
  g.key("f64", ValueType::FLOAT64).put<double>(-2.5e300);
  g.key("empty", ValueType::STRING).str("");
  g.key("utf8", ValueType::STRING).str("h\xC3\xA9llo \xE2\x96\x81");
  auto& a = g.key("tokens", ValueType::ARRAY).put<uint32_t>(8).put<uint64_t>(3);
  a.str("<s>").str("").str("\xC4\xA0the");
  g.key("ints", ValueType::ARRAY)
      .put<uint32_t>(5)
      .put<uint64_t>(3)
      .put<int32_t>(-1)
      .put<int32_t>(0)
      .put<int32_t>(7);
  g.key("floats", ValueType::ARRAY)
      .put<uint32_t>(6)
      .put<uint64_t>(2)
      .put<float>(0.5f)
      .put<float>(-1.25f);
  g.key("empty_arr", ValueType::ARRAY).put<uint32_t>(4).put<uint64_t>(0);
  auto& n = g.key("nested", ValueType::ARRAY).put<uint32_t>(9).put<uint64_t>(2);
  n.put<uint32_t>(0).put<uint64_t>(2).put<uint8_t>(1).put<uint8_t>(2);
  n.put<uint32_t>(7).put<uint64_t>(1).put<uint8_t>(0);
  g.key("general.alignment", ValueType::UINT32).put<uint32_t>(64);
  g.alignment = 64;

  g.tensor("a", {4, 2}, TensorType::F32, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<uint8_t> q8(34);
  const uint16_t d = 0x3800;  // 0.5
  std::memcpy(q8.data(), &d, 2);
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  g.tensor("blk.0.q", {32}, TensorType::Q8_0, q8);
  return g;
}

TEST(GgufRead, AllValueTypes) {
  TempFile tf(full_builder().build());
  const File f = File::open(tf.path());
  EXPECT_EQ(f.path(), tf.path());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  ASSERT_EQ(f.metadata().size(), 20u);
  EXPECT_EQ(f.metadata()[0].first, "general.architecture");  // file order kept
  EXPECT_EQ(f.metadata()[19].first, "general.alignment");

  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("u8"), 200u);
  EXPECT_EQ(f.get_int("i8"), -100);
  EXPECT_EQ(f.get_uint("u16"), 60000u);
  EXPECT_EQ(f.get_int("i16"), -30000);
  EXPECT_EQ(f.get_uint("u32"), 4000000000u);
  EXPECT_EQ(f.get_int("u32"), 4000000000);  // unsigned that fits int64
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(f.get_float("f32"), 0.15625);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_uint("u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get_int("i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_float("f64"), -2.5e300);
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_string("utf8"), "h\xC3\xA9llo \xE2\x96\x81");
  EXPECT_EQ(f.get_string_array("tokens"), (std::vector<std::string>{"<s>", "", "\xC4\xA0the"}));
  EXPECT_EQ(f.get_int_array("ints"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(f.get_float_array("floats"), (std::vector<double>{0.5, -1.25}));
  EXPECT_TRUE(f.get_int_array("empty_arr").empty());

  const Value& nested = f.get("nested");
  EXPECT_EQ(nested.type, ValueType::ARRAY);
  EXPECT_EQ(nested.array_type, ValueType::ARRAY);
  EXPECT_EQ(nested.type_string(), "ARRAY[ARRAY]");
  const auto& outer = std::get<std::vector<Value>>(nested.v);
  ASSERT_EQ(outer.size(), 2u);
  EXPECT_EQ(outer[0].array_type, ValueType::UINT8);
  EXPECT_EQ(std::get<std::vector<Value>>(outer[0].v).size(), 2u);
  EXPECT_EQ(outer[1].array_type, ValueType::BOOL);

  EXPECT_TRUE(f.has("u8"));
  EXPECT_FALSE(f.has("nope"));
  EXPECT_EQ(f.find_uint("nope"), std::nullopt);
  EXPECT_EQ(f.find_uint("u8"), 200u);
  EXPECT_EQ(f.find_float("f32"), 0.15625);
  EXPECT_EQ(f.find_bool("bool"), true);
  EXPECT_EQ(f.find_string("general.architecture"), "llama");
  EXPECT_EQ(f.find_string("nope"), std::nullopt);
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(GgufRead, TypedGetterErrors) {
  TempFile tf(full_builder().build());
  const File f = File::open(tf.path());
  std::string m = error_of([&] { f.get("missing.key"); });
  EXPECT_NE(m.find(tf.path()), std::string::npos) << m;
  EXPECT_NE(m.find("'missing.key' not found"), std::string::npos) << m;

  m = error_of([&] { f.get_uint("general.architecture"); });
  EXPECT_NE(m.find(tf.path()), std::string::npos) << m;
  EXPECT_NE(m.find("'general.architecture'"), std::string::npos) << m;
  EXPECT_NE(m.find("found STRING"), std::string::npos) << m;
  EXPECT_NE(m.find("offset 24:"), std::string::npos)
      << m;  // first record follows the 24-byte header

  EXPECT_NE(error_of([&] { f.get_uint("i8"); }).find("non-negative"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_int("u64"); }).find("fits int64"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_float("u32"); }).find("found UINT32"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_bool("u8"); }).find("found UINT8"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_string_array("ints"); }).find("found ARRAY[INT32]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.get_int_array("tokens"); }).find("found ARRAY[STRING]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.get_float_array("ints"); }).find("found ARRAY[INT32]"),
            std::string::npos);
  EXPECT_THROW(f.find_uint("general.architecture"), Error);  // present, wrong type
  EXPECT_THROW(f.find_string("u8"), Error);
}

TEST(GgufRead, Tensors) {
  TempFile tf(full_builder().build());
  const File f = File::open(tf.path());
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo& a = f.tensor("a");
  EXPECT_EQ(a.shape, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(a.type, TensorType::F32);
  EXPECT_EQ(a.n_elements, 8u);
  EXPECT_EQ(a.n_bytes, 32u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(dequantize(f, a), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));

  const TensorInfo* q = f.find_tensor("blk.0.q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, TensorType::Q8_0);
  EXPECT_EQ(q->n_bytes, 34u);
  EXPECT_EQ(q->offset, 64u);  // 32 bytes of "a" padded to the 64-byte alignment
  EXPECT_EQ(f.tensor_data(*q).size(), 34u);
  EXPECT_EQ(f.data_offset() + q->offset + q->n_bytes, f.file_size());
  const auto y = dequantize(f, *q);
  ASSERT_EQ(y.size(), 32u);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], static_cast<float>(j - 16) * 0.5f);

  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  const std::string m = error_of([&] { f.tensor("nope"); });
  EXPECT_NE(m.find(tf.path()), std::string::npos) << m;
  EXPECT_NE(m.find("'nope'"), std::string::npos) << m;
}

TEST(GgufRead, MoveOnly) {
  TempFile tf(full_builder().build());
  File f = File::open(tf.path());
  File g = std::move(f);
  EXPECT_EQ(g.tensors().size(), 2u);
  EXPECT_EQ(dequantize(g, g.tensor("a"))[7], 8.0f);
  File h = File::open(tf.path());
  h = std::move(g);
  EXPECT_EQ(h.get_string("general.architecture"), "llama");
  static_assert(!std::is_copy_constructible_v<File>);
}

TEST(GgufRead, VersionTwoAndDefaultAlignment) {
  GgufBuilder g;
  g.version = 2;
  g.key("k", ValueType::UINT32).put<uint32_t>(7);
  g.tensor("t", {2}, TensorType::F16, {0x00, 0x3C, 0x00, 0xC0});
  TempFile tf(g.build());
  const File f = File::open(tf.path());
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(dequantize(f, f.tensor("t")), (std::vector<float>{1.0f, -2.0f}));
}

TEST(GgufRead, UnknownTensorTypeIsListedButNotReadable) {
  GgufBuilder g;
  g.tensor("weird", {32}, static_cast<TensorType>(4), std::vector<uint8_t>(20));
  g.tensor("iq", {256}, TensorType::IQ2_XXS, std::vector<uint8_t>(66));
  TempFile tf(g.build());
  const File f = File::open(tf.path());
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(type_name(f.tensors()[0].type), "type#4");
  const std::string m = error_of([&] { f.tensor_data(f.tensors()[0]); });
  EXPECT_NE(m.find("unknown tensor type 4"), std::string::npos) << m;
  EXPECT_NE(m.find("'weird'"), std::string::npos) << m;
  EXPECT_THROW(dequantize(f, f.tensors()[0]), Error);
  // Known but not dequantizable: bytes readable, dequantize refuses.
  EXPECT_EQ(f.tensor_data(f.tensor("iq")).size(), 66u);
  EXPECT_NE(error_of([&] { dequantize(f, f.tensor("iq")); }).find("IQ2_XXS"), std::string::npos);
}

TEST(GgufRead, EmptyFileWithoutTensors) {
  GgufBuilder g;
  TempFile tf(g.build());
  const File f = File::open(tf.path());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
}

}  // namespace
}  // namespace touchstone::gguf
