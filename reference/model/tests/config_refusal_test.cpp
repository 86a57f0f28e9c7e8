// The reference never computes a model it only partly understands: an unknown
// llama.* key (rope.scaling.type, ...) or an extra tensor (rope_freqs.weight,
// biases) is refused by name, TS_ERR_UNSUPPORTED through the ABI.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gguf_builder.h"
#include "touchstone/gguf.h"
#include "touchstone/llama_config.h"

namespace touchstone {
namespace {

namespace gg = touchstone::gguf;
using gg::TensorType;
using gg::ValueType;

// A 1-layer llama (d 8, 2 heads, vocab 16) with F32 weights; `extra_key` and
// `extra_tensor` add one more of each when non-empty.
std::vector<uint8_t> tiny_llama(const std::string& extra_key, const std::string& extra_tensor,
                                uint32_t n_layer_tensors = 1) {
  gg::testing::GgufBuilder g;
  const uint64_t d = 8, ff = 16, V = 16;
  g.key("general.architecture", ValueType::STRING).str("llama");
  auto u32 = [&](const std::string& k, uint32_t v) {
    g.key(k, ValueType::UINT32).put<uint32_t>(v);
  };
  u32("llama.block_count", 1);
  u32("llama.embedding_length", d);
  u32("llama.feed_forward_length", ff);
  u32("llama.attention.head_count", 2);
  u32("llama.context_length", 64);
  u32("llama.vocab_size", uint32_t(V));
  g.key("llama.attention.layer_norm_rms_epsilon", ValueType::FLOAT32).put<float>(1e-5f);
  if (!extra_key.empty()) g.key(extra_key, ValueType::STRING).str("yarn");
  auto t = [&](const std::string& name, std::vector<uint64_t> shape) {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    g.tensor(name, shape, TensorType::F32, std::vector<uint8_t>(n * 4, 0));
  };
  t("token_embd.weight", {d, V});
  t("output_norm.weight", {d});
  for (uint32_t l = 0; l < n_layer_tensors; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* v : {"attn_norm", "ffn_norm"}) t(b + v + ".weight", {d});
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"})
      t(b + m + ".weight", {d, d});
    t(b + "ffn_gate.weight", {d, ff});
    t(b + "ffn_up.weight", {d, ff});
    t(b + "ffn_down.weight", {ff, d});
  }
  if (!extra_tensor.empty()) t(extra_tensor, {d});
  return g.build();
}

std::string refusal(const std::vector<uint8_t>& bytes) {
  gg::testing::TempFile f(bytes, "refusal");
  const gg::File file = gg::File::open(f.path());
  try {
    read_llama_config(file);
  } catch (const UnsupportedModel& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigRefusal, AcceptsTheKnownLlamaLayout) { EXPECT_EQ(refusal(tiny_llama("", "")), ""); }

TEST(ConfigRefusal, RefusesUnknownArchitectureKeysByName) {
  for (const char* key :
       {"llama.rope.scaling.type", "llama.expert_count", "llama.attention.sliding_window"}) {
    const std::string msg = refusal(tiny_llama(key, ""));
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  }
}

TEST(ConfigRefusal, RefusesTensorsTheForwardPassWouldIgnore) {
  for (const char* name : {"rope_freqs.weight", "blk.0.attn_q.bias", "blk.0.post_ffw_norm.weight",
                           "blk.1.attn_norm.weight"}) {
    const std::string msg = refusal(tiny_llama("", name));
    EXPECT_NE(msg.find(name), std::string::npos) << name << ": " << msg;
  }
}

TEST(ConfigRefusal, HarmlessGeneralKeysAreAllowed) {
  EXPECT_EQ(refusal(tiny_llama("general.name", "")), "");
}

}  // namespace
}  // namespace touchstone
