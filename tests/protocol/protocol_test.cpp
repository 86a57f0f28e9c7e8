// The child-process protocol codec (touchstone/protocol.h): round trips, and
// every malformed input is a ProtocolError naming the message and field.
#include "touchstone/protocol.h"

#include <gtest/gtest.h>

#include <cstring>

namespace touchstone::protocol {
namespace {

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

TEST(Protocol, FrameRoundTrip) {
  Writer w;
  w.u32(7).i32(-3).u64(1ull << 40).str("héllo").i32s(std::vector<int32_t>{1, -2, 3});
  const std::vector<float> f = {1.5f, -0.0f, 3e38f};
  w.f32s(f);
  const std::string fr = frame(uint32_t(Op::kDecode) | kReplyBit, w.bytes());
  const std::string header = fr.substr(0, kHeaderSize);
  const FrameHeader h = parse_header(bytes(header), 1 << 20);
  EXPECT_EQ(h.op, uint32_t(Op::kDecode) | kReplyBit);
  ASSERT_EQ(h.payload_len, fr.size() - kHeaderSize);
  const std::string payload = fr.substr(kHeaderSize);
  Reader r(bytes(payload), "test");
  EXPECT_EQ(r.u32("a"), 7u);
  EXPECT_EQ(r.i32("b"), -3);
  EXPECT_EQ(r.u64("c"), 1ull << 40);
  EXPECT_EQ(r.str("d"), "héllo");
  std::vector<int32_t> ints(3);
  r.i32s("e", ints);
  EXPECT_EQ(ints, (std::vector<int32_t>{1, -2, 3}));
  std::vector<float> back(3);
  r.f32s("f", back);
  EXPECT_EQ(std::memcmp(back.data(), f.data(), 12), 0);
  EXPECT_NO_THROW(r.finish());
}

TEST(Protocol, HeaderChecksMagicAndLimitBeforeAllocating) {
  std::string fr = frame(1, "abc");
  fr[0] = 'X';
  const std::string bad_magic = fr.substr(0, kHeaderSize);
  EXPECT_NE(error_of([&] { parse_header(bytes(bad_magic), 100); }).find("magic"),
            std::string::npos);
  const std::string big =
      frame(uint32_t(Op::kPrefill), std::string(200, 'x')).substr(0, kHeaderSize);
  const std::string msg = error_of([&] { parse_header(bytes(big), 100); });
  EXPECT_NE(msg.find("exceeds the limit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("prefill"), std::string::npos) << msg;
  EXPECT_FALSE(error_of([&] { parse_header(bytes("short"), 100); }).empty());
}

TEST(Protocol, ShortPayloadNamesTheField) {
  Writer w;
  w.u32(1);
  Reader r(bytes(w.bytes()), "decode reply");
  r.u32("status");
  const std::string msg = error_of([&] { r.u64("session"); });
  EXPECT_NE(msg.find("decode reply"), std::string::npos) << msg;
  EXPECT_NE(msg.find("session"), std::string::npos) << msg;
}

TEST(Protocol, StringLengthIsBoundedBeforeCopying) {
  Writer w;
  w.u32(0xFFFFFFFFu);
  Reader r(bytes(w.bytes()), "hello reply");
  EXPECT_NE(error_of([&] { r.str("name", 4096); }).find("exceeds the limit"), std::string::npos);
}

TEST(Protocol, TrailingBytesAreAnError) {
  Writer w;
  w.u32(1).u32(2);
  Reader r(bytes(w.bytes()), "rewind reply");
  r.u32("status");
  EXPECT_NE(error_of([&] { r.finish(); }).find("trailing"), std::string::npos);
}

TEST(Protocol, CapabilitiesRoundTripAndBucketCountIsChecked) {
  ts_capabilities c{};
  c.struct_size = sizeof c;
  c.flags = TS_CAP_STATIC_SHAPES;
  c.weight_types = TS_WEIGHT_TYPE_BIT(3);
  c.max_context = 2048;
  c.n_shape_buckets = 2;
  c.shape_buckets[0] = 16;
  c.shape_buckets[1] = 64;
  c.determinism_note = "threads";
  Writer w;
  encode(w, c);
  std::string note;
  Reader r(bytes(w.bytes()), "capabilities reply");
  const ts_capabilities d = decode_capabilities(r, note);
  EXPECT_EQ(d.flags, c.flags);
  EXPECT_EQ(d.weight_types, c.weight_types);
  EXPECT_EQ(d.n_shape_buckets, 2);
  EXPECT_EQ(d.shape_buckets[1], 64);
  EXPECT_STREQ(d.determinism_note, "threads");
  Writer bad;
  bad.u32(0).u64(0).i32(0).i32(17);
  Reader rb(bytes(bad.bytes()), "capabilities reply");
  EXPECT_NE(error_of([&] { decode_capabilities(rb, note); }).find("n_shape_buckets"),
            std::string::npos);
}

TEST(Protocol, BackendInfoRoundTrip) {
  BackendInfo i;
  i.api_version = 2;
  i.name = "cpu_simd";
  i.version = "1.0";
  i.path = "/x/lib.so";
  i.device = "CPU";
  i.device_greedy = true;
  i.declares_models = true;
  i.architectures = "llama,gemma3";
  i.model_features = "neox_rope,qk_norm";
  i.taps = true;
  Writer w;
  encode(w, i);
  Reader r(bytes(w.bytes()), "hello reply");
  const BackendInfo d = decode_info(r);
  EXPECT_EQ(d.name, "cpu_simd");
  EXPECT_EQ(d.device, "CPU");
  EXPECT_TRUE(d.device_greedy);
  EXPECT_EQ(d.api_version, 2u);
  EXPECT_TRUE(d.declares_models);
  EXPECT_EQ(d.architectures, "llama,gemma3");
  EXPECT_EQ(d.model_features, "neox_rope,qk_norm");
  EXPECT_TRUE(d.taps);
  r.finish();
}

}  // namespace
}  // namespace touchstone::protocol
