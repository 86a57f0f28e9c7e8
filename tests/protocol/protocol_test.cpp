// The child-process protocol codec (touchstone/runtime/protocol.h): round trips, and
// every malformed input is a ProtocolError naming the message and field.
#include "touchstone/runtime/protocol.h"

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
  EXPECT_FALSE(d.step_batch);
  EXPECT_FALSE(d.fork);
  r.finish();
}

TEST(Protocol, BackendInfoCarriesServingMembersFromVersion4) {
  BackendInfo i;
  i.api_version = 6;
  i.name = "x";
  i.step_batch = true;
  i.fork = true;
  Writer w;
  encode(w, i);
  Reader r(bytes(w.bytes()), "hello reply");
  const BackendInfo d = decode_info(r);
  r.finish();
  EXPECT_EQ(d.protocol_version, kVersion);
  EXPECT_TRUE(d.step_batch);
  EXPECT_TRUE(d.fork);
  // A version-3 peer's hello ends after taps: it decodes, with neither member.
  i.protocol_version = 3;
  Writer old;
  encode(old, i);
  // v4's two members, v5's one, v6's two, v7's two
  EXPECT_EQ(old.bytes().size() + 8 + 4 + 8 + 8, w.bytes().size());
  Reader ro(bytes(old.bytes()), "hello reply");
  const BackendInfo o = decode_info(ro);
  ro.finish();
  EXPECT_EQ(o.protocol_version, 3u);
  EXPECT_FALSE(o.step_batch);
  EXPECT_FALSE(o.fork);
}

// ABI v7 structured output: BackendInfo.grammar from protocol version 5; a
// version-4 peer's hello ends before it, and its capabilities lose bit 9.
TEST(Protocol, BackendInfoCarriesGrammarFromVersion5) {
  BackendInfo i;
  i.protocol_version = 5;
  i.api_version = 7;
  i.name = "g";
  i.grammar = true;
  Writer w;
  encode(w, i);
  Reader r(bytes(w.bytes()), "hello reply");
  EXPECT_TRUE(decode_info(r).grammar);
  r.finish();
  i.protocol_version = 4;
  Writer old;
  encode(old, i);
  EXPECT_EQ(old.bytes().size() + 4, w.bytes().size());
  Reader ro(bytes(old.bytes()), "hello reply");
  EXPECT_FALSE(decode_info(ro).grammar);
  ro.finish();
  ts_capabilities c{};
  c.flags = TS_CAP_STRUCTURED_OUTPUT | TS_CAP_ALL_POSITION_LOGITS;
  for (uint32_t v : {4u, 5u}) {
    Writer cw;
    encode(cw, c, v);
    Reader cr(bytes(cw.bytes()), "capabilities reply");
    std::string note;
    const ts_capabilities d = decode_capabilities(cr, note, v);
    EXPECT_EQ(d.flags, v >= 5 ? c.flags : uint32_t(TS_CAP_ALL_POSITION_LOGITS)) << v;
  }
}

// ABI v8 multimodal: BackendInfo.embeddings / vision from protocol version 6; a
// version-5 peer's hello ends before them, and its capabilities lose bits 10 and 11.
TEST(Protocol, BackendInfoCarriesMultimodalFromVersion6) {
  BackendInfo i;
  i.api_version = 8;
  i.name = "m";
  i.embeddings = true;
  i.vision = true;
  Writer w;
  encode(w, i);
  Reader r(bytes(w.bytes()), "hello reply");
  const BackendInfo d = decode_info(r);
  r.finish();
  EXPECT_TRUE(d.embeddings && d.vision);
  i.protocol_version = 5;
  Writer old;
  encode(old, i);
  EXPECT_EQ(old.bytes().size() + 8 + 8, w.bytes().size());  // v6's two, v7's two
  Reader ro(bytes(old.bytes()), "hello reply");
  const BackendInfo o = decode_info(ro);
  ro.finish();
  EXPECT_FALSE(o.embeddings || o.vision);
  ts_capabilities c{};
  c.flags = TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL | TS_CAP_ALL_POSITION_LOGITS;
  for (uint32_t v : {5u, 6u}) {
    Writer cw;
    encode(cw, c, v);
    Reader cr(bytes(cw.bytes()), "capabilities reply");
    std::string note;
    const ts_capabilities dc = decode_capabilities(cr, note, v);
    EXPECT_EQ(dc.flags, v >= 6 ? c.flags : uint32_t(TS_CAP_ALL_POSITION_LOGITS)) << v;
  }
  EXPECT_STREQ(op_name(uint32_t(Op::kPrefillEmbeddings)), "prefill_embeddings");
  EXPECT_STREQ(op_name(uint32_t(Op::kEncodeImage) | kReplyBit), "encode_image");
}

// ABI v9 preprocessing: BackendInfo.preprocess / vision_options from protocol version 7; a
// version-6 peer's hello ends before them.
TEST(Protocol, BackendInfoCarriesPreprocessFromVersion7) {
  BackendInfo i;
  i.api_version = 9;
  i.name = "p";
  i.vision = i.preprocess = i.vision_options = true;
  Writer w;
  encode(w, i);
  Reader r(bytes(w.bytes()), "hello reply");
  const BackendInfo d = decode_info(r);
  r.finish();
  EXPECT_TRUE(d.vision && d.preprocess && d.vision_options);
  i.protocol_version = 6;
  Writer old;
  encode(old, i);
  EXPECT_EQ(old.bytes().size() + 8, w.bytes().size());
  Reader ro(bytes(old.bytes()), "hello reply");
  const BackendInfo o = decode_info(ro);
  ro.finish();
  EXPECT_TRUE(o.vision);
  EXPECT_FALSE(o.preprocess || o.vision_options);
  EXPECT_STREQ(op_name(uint32_t(Op::kPreprocessImage)), "preprocess_image");
  EXPECT_STREQ(op_name(uint32_t(Op::kSetVisionOptions) | kReplyBit), "set_vision_options");
}

TEST(Protocol, VersionNegotiation) {
  EXPECT_EQ(negotiate(kVersion), kVersion);
  EXPECT_EQ(negotiate(3), 3u);
  EXPECT_EQ(negotiate(kVersion + 1), kVersion);  // a newer harness decides
  EXPECT_EQ(negotiate(2), kVersion);             // too old: it will refuse ours
  EXPECT_STREQ(op_name(uint32_t(Op::kStepBatch) | kReplyBit), "step_batch");
  EXPECT_STREQ(op_name(uint32_t(Op::kForkSession)), "fork_session");
}

ts_capabilities serving_caps() {
  ts_capabilities c{};
  c.struct_size = sizeof c;
  c.flags = TS_CAP_BATCH_INVARIANT | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY |
            TS_CAP_ALL_POSITION_LOGITS;
  c.weight_types = TS_WEIGHT_TYPE_BIT(0);
  c.batch_invariant_paths = 1u << TS_WEIGHTS_QUANTIZED;
  c.max_batch = 32;
  return c;
}

TEST(Protocol, CapabilitiesCarryBatchFieldsFromVersion4) {
  const ts_capabilities c = serving_caps();
  std::string note;
  Writer w;
  encode(w, c);
  Reader r(bytes(w.bytes()), "capabilities reply");
  const ts_capabilities d = decode_capabilities(r, note);
  r.finish();
  EXPECT_EQ(d.flags, c.flags);
  EXPECT_EQ(d.batch_invariant_paths, c.batch_invariant_paths);
  EXPECT_EQ(d.max_batch, 32);
  // Protocol 3 ends after top_n: the v6 fields are 0 and the v6 flags dropped.
  Writer old;
  encode(old, c, 3);
  Reader ro(bytes(old.bytes()), "capabilities reply");
  const ts_capabilities o = decode_capabilities(ro, note, 3);
  ro.finish();
  EXPECT_EQ(o.flags, uint32_t(TS_CAP_ALL_POSITION_LOGITS));
  EXPECT_EQ(o.batch_invariant_paths, 0u);
  EXPECT_EQ(o.max_batch, 0);
  // A version-4 reply that ends before them (a Python engine built earlier): the same.
  Reader rs(bytes(old.bytes()), "capabilities reply");
  EXPECT_EQ(decode_capabilities(rs, note).flags, uint32_t(TS_CAP_ALL_POSITION_LOGITS));
  ts_capabilities neg = c;
  neg.max_batch = -1;
  Writer wn;
  encode(wn, neg);
  Reader rn(bytes(wn.bytes()), "capabilities reply");
  EXPECT_NE(error_of([&] { decode_capabilities(rn, note); }).find("max_batch"), std::string::npos);
}

TEST(Protocol, StepBatchRequestRoundTrip) {
  const std::vector<int32_t> a = {7}, b = {1, 2, 3, 4, 5}, c = {9, 8, 7};
  const std::vector<BatchEntry> in = {{11, false, a}, {22, false, b}, {33, true, c}};
  Writer w;
  encode_step_batch(w, in);
  EXPECT_EQ(w.bytes().size(), 4 + 3 * 16 + 4 * (1 + 5 + 3));
  Reader r(bytes(w.bytes()), "step_batch request");
  const std::vector<DecodedBatchEntry> out = decode_step_batch(r);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].session, 11u);
  EXPECT_FALSE(out[0].all_positions);
  EXPECT_EQ(out[0].tokens, a);
  EXPECT_EQ(out[1].tokens, b);
  EXPECT_EQ(out[2].session, 33u);
  EXPECT_TRUE(out[2].all_positions);
  EXPECT_EQ(out[2].tokens, c);
}

std::string batch_error(const Writer& w) {
  Reader r(bytes(w.bytes()), "step_batch request");
  return error_of([&] { decode_step_batch(r); });
}

TEST(Protocol, MalformedStepBatchIsRefusedBeforeAllocating) {
  Writer huge_n;  // 4 billion entries announced, one entry's bytes present
  huge_n.u32(0xFFFFFFFFu).u64(1).i32(0).i32(1).i32(5);
  std::string msg = batch_error(huge_n);
  EXPECT_NE(msg.find("n_entries 4294967295"), std::string::npos) << msg;
  Writer zero;
  zero.u32(0);
  EXPECT_NE(batch_error(zero).find("n_entries 0"), std::string::npos);
  Writer huge_tokens;  // 2^31 - 1 tokens announced, one present
  huge_tokens.u32(1).u64(1).i32(0).i32(0x7FFFFFFF).i32(5);
  msg = batch_error(huge_tokens);
  EXPECT_NE(msg.find("entry 0: n_tokens 2147483647"), std::string::npos) << msg;
  Writer negative;
  negative.u32(2).u64(1).i32(0).i32(1).i32(5).u64(2).i32(0).i32(-1);
  msg = batch_error(negative);
  EXPECT_NE(msg.find("entry 1: n_tokens -1"), std::string::npos) << msg;
  Writer trailing;
  trailing.u32(1).u64(1).i32(0).i32(1).i32(5).u32(0);
  EXPECT_NE(batch_error(trailing).find("trailing"), std::string::npos);
  Writer short_entry;  // the second entry's header is cut short
  short_entry.u32(2).u64(1).i32(0).i32(0).u64(2).i32(0);
  EXPECT_FALSE(batch_error(short_entry).empty());
}

TEST(Protocol, ForkRequestRoundTripAndShortPayload) {
  Writer w;
  encode(w, ForkRequest{0x1234, 7});
  Reader r(bytes(w.bytes()), "fork_session request");
  const ForkRequest f = decode_fork(r);
  EXPECT_EQ(f.session, 0x1234u);
  EXPECT_EQ(f.n_prefix, 7);
  Writer s;
  s.u64(1);
  Reader rs(bytes(s.bytes()), "fork_session request");
  const std::string msg = error_of([&] { decode_fork(rs); });
  EXPECT_NE(msg.find("n_prefix"), std::string::npos) << msg;
  Writer t;
  t.u64(1).i32(2).i32(3);
  Reader rt(bytes(t.bytes()), "fork_session request");
  EXPECT_NE(error_of([&] { decode_fork(rt); }).find("trailing"), std::string::npos);
}

}  // namespace
}  // namespace touchstone::protocol
