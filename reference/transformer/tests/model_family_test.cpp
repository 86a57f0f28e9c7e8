// Every supported family, described as data: each loads and runs through the one
// forward pass, bitwise deterministic across thread counts; a family's GGUF with one
// unknown tensor, one unknown key or an unknown rope.scaling.type is refused by name
// (the reference never computes a model it only partly understands); the plain-Llama
// backends refuse other families naming the missing features; sliding-window
// attention and the Gemma 3 local/global layer pattern behave as HF's masks do.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tiny_family.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/llama_config.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
namespace {

namespace gg = touchstone::gguf;
using testing::tiny_model;
using testing::TinyOptions;

const char* const kFamilies[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};

TinyOptions opts(const std::string& arch) {
  TinyOptions o;
  o.arch = arch;
  if (arch == "gemma3") o.sliding_window = 4;
  return o;
}

std::string refusal(const TinyOptions& o) {
  gg::testing::TempFile f(tiny_model(o), "refusal");
  const gg::File file = gg::File::open(f.path());
  try {
    read_model_config(file);
  } catch (const UnsupportedModel& e) {
    return e.what();
  }
  return "";
}

// Logits of every position of `tokens` (one forward call per token).
std::vector<std::vector<float>> run(const std::vector<uint8_t>& model,
                                    const std::vector<int32_t>& tokens, int threads) {
  gg::testing::TempFile f(model, "run");
  const StoredWeights w = load_stored_weights(f.path());
  ReferenceTransformer ref(w, 64, threads);
  std::vector<std::vector<float>> out;
  for (int32_t t : tokens) {
    out.emplace_back(size_t(w.config.n_vocab));
    ref.forward(t, out.back());
  }
  return out;
}

TEST(ModelFamily, EveryFamilyLoadsAndIsDeterministicAcrossThreads) {
  const std::vector<int32_t> tokens = {1, 7, 3, 30, 12, 5, 9, 2};
  for (const char* arch : kFamilies) {
    const auto model = tiny_model(opts(arch));
    const auto a = run(model, tokens, 1), b = run(model, tokens, 3);
    ASSERT_EQ(a.size(), tokens.size()) << arch;
    for (size_t p = 0; p < a.size(); ++p) {
      for (float v : a[p]) ASSERT_TRUE(std::isfinite(v)) << arch << " position " << p;
      EXPECT_EQ(0, std::memcmp(a[p].data(), b[p].data(), a[p].size() * sizeof(float)))
          << arch << " position " << p << " differs between 1 and 3 threads";
    }
    // Distinct families are distinct computations: logits differ from the llama layout.
    EXPECT_NE(a.back()[0], 0.0f) << arch;
  }
}

TEST(ModelFamily, UnknownTensorIsRefusedByName) {
  for (const char* arch : kFamilies) {
    TinyOptions o = opts(arch);
    o.extra_tensor = "blk.0.attn_extra.weight";
    const std::string msg = refusal(o);
    EXPECT_NE(msg.find("blk.0.attn_extra.weight"), std::string::npos) << arch << ": " << msg;
    o.extra_tensor = "blk.9.attn_norm.weight";  // a layer the model does not have
    EXPECT_NE(refusal(o).find("blk.9.attn_norm.weight"), std::string::npos) << arch;
  }
}

TEST(ModelFamily, UnknownRopeScalingTypeIsRefusedByName) {
  for (const char* arch : kFamilies) {
    TinyOptions o = opts(arch);
    o.extra_string_key = std::string(arch) + ".rope.scaling.type";
    o.extra_string_value = "yarn";
    const std::string msg = refusal(o);
    EXPECT_NE(msg.find("rope.scaling.type"), std::string::npos) << arch << ": " << msg;
    EXPECT_NE(msg.find("yarn"), std::string::npos) << arch << ": " << msg;
  }
}

TEST(ModelFamily, UnknownArchitectureKeyIsRefusedByName) {
  for (const char* arch : kFamilies) {
    TinyOptions o = opts(arch);
    o.extra_string_key = std::string(arch) + ".expert_gating_func";
    const std::string msg = refusal(o);
    EXPECT_NE(msg.find(o.extra_string_key), std::string::npos) << arch << ": " << msg;
  }
  TinyOptions o = opts("llama");  // harmless general.* metadata is allowed
  o.extra_string_key = "general.description";
  EXPECT_EQ(refusal(o), "");
  // Written by llama.cpp's converter for every Phi-3; harmless without LongRoPE/YaRN.
  o = opts("phi3");
  o.extra_string_key = "phi3.rope.scaling.original_context_length";
  EXPECT_EQ(refusal(o), "");
}

TEST(ModelFamily, UnknownArchitectureIsRefusedByName) {
  const std::string msg = refusal(opts("mamba"));
  EXPECT_NE(msg.find("'mamba' is not supported"), std::string::npos) << msg;
}

TEST(ModelFamily, PlainLlamaBackendsRefuseOtherFamiliesNamingTheFeatures) {
  for (const char* arch : kFamilies) {
    gg::testing::TempFile f(tiny_model(opts(arch)), "plain");
    const gg::File file = gg::File::open(f.path());
    if (std::string(arch) == "llama") {
      EXPECT_NO_THROW(read_llama_config(file));
      continue;
    }
    try {
      read_llama_config(file);
      ADD_FAILURE() << arch << " accepted by read_llama_config";
    } catch (const UnsupportedModel& e) {
      EXPECT_NE(std::string(e.what()).find("NeoX RoPE"), std::string::npos) << e.what();
    }
  }
  TinyOptions o = opts("llama");
  o.extra_tensor = "rope_freqs.weight";  // llama3 scaling: the reference computes it ...
  EXPECT_EQ(refusal(o), "");
  gg::testing::TempFile f(tiny_model(o), "rope_freqs");
  try {  // ... the plain backends do not
    read_llama_config(gg::File::open(f.path()));
    ADD_FAILURE() << "rope_freqs accepted by read_llama_config";
  } catch (const UnsupportedModel& e) {
    EXPECT_NE(std::string(e.what()).find("rope_freqs"), std::string::npos) << e.what();
  }
}

// A backend's declared lists against a config: the architecture first, then
// each missing feature in words; nothing when the lists cover the config.
TEST(ModelFamily, UnsupportedFeaturesNamesWhatTheListsLeaveOut) {
  gg::testing::TempFile f(tiny_model(opts("qwen3")), "lists");
  const ModelConfig c = read_model_config(gg::File::open(f.path()));
  const std::vector<std::string> names = c.feature_names();
  ASSERT_FALSE(names.empty());
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ",") + n;
  EXPECT_EQ(unsupported_features(c, "llama,qwen3", all), "");
  EXPECT_EQ(unsupported_features(c, "llama,qwen3,", "x," + all), "");
  const std::string no_arch = unsupported_features(c, "llama,qwen2", all);
  EXPECT_EQ(no_arch, "architecture 'qwen3'");
  const std::string no_first = unsupported_features(c, "qwen3", all.substr(names[0].size()));
  EXPECT_EQ(no_first, feature_description(names[0]));
  // A listed name that is only a prefix of the architecture does not cover it.
  EXPECT_NE(unsupported_features(c, "qwen", all), "");
  // Nothing listed: the words ModelConfig::extra_features() gives for a non-Llama.
  EXPECT_EQ(unsupported_features(c, "", ""), c.extra_features());
}

TEST(ModelFamily, Gemma3LayerPatternAndRopeBases) {
  TinyOptions o = opts("gemma3");
  o.n_layer = 12;
  gg::testing::TempFile f(tiny_model(o), "gemma");
  const ModelConfig c = read_model_config(gg::File::open(f.path()));
  for (int l = 0; l < 12; ++l) {
    const LayerConfig& lc = c.layers[size_t(l)];
    const bool global = l % 6 == 5;  // HF Gemma3 layer_types, llama.cpp set_swa_pattern(6)
    EXPECT_EQ(lc.sliding_window, global ? 0 : 4) << l;
    EXPECT_EQ(lc.rope_base, global ? 1e6 : 10000.0) << l;
  }
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(c.embd_scale, double(float(std::sqrt(16.0))));
  EXPECT_TRUE(c.tied_embeddings);
}

// With a window of W on every layer, the logits at position p >= W' (where the
// receptive field W' = n_layer * (W - 1) + 1 ends) cannot depend on token 0.
TEST(ModelFamily, SlidingWindowForgetsTokensOutsideTheWindow) {
  TinyOptions o = opts("llama");
  o.sliding_window = 3;
  o.n_layer = 2;
  const auto model = tiny_model(o);
  std::vector<int32_t> a = {1, 5, 9, 13, 17, 21, 25, 29}, b = a;
  b[0] = 2;
  const auto la = run(model, a, 1), lb = run(model, b, 1);
  EXPECT_NE(la[1], lb[1]);  // inside the window: token 0 matters
  EXPECT_EQ(la[5], lb[5]);  // receptive field 2 * (3 - 1) + 1 = 5 positions
  EXPECT_EQ(la.back(), lb.back());
  o.sliding_window = 0;  // without a window token 0 always matters
  const auto model_full = tiny_model(o);
  EXPECT_NE(run(model_full, a, 1).back(), run(model_full, b, 1).back());
}

}  // namespace
}  // namespace touchstone
