// model_config.cpp - ModelConfig from GGUF metadata; see touchstone/model/model_config.h.
//
// Interpretation of each key follows llama.cpp's src/llama-model.cpp (load_hparams)
// and the HF transformers config of the family; the comments name the source.
#include "touchstone/model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "gptoss_config.h"
#include "moe_config.h"
#include "touchstone/model/gguf.h"

namespace touchstone {
namespace {

int32_t positive_i32(const gguf::File& f, const std::string& key, uint64_t v) {
  if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("{}: metadata key '{}': value {} out of range (1..2^31-1)", f.path(), key, v);
  }
  return static_cast<int32_t>(v);
}

const std::map<std::string, Family> kFamilies = {
    {"llama", Family::Llama},    {"qwen2", Family::Qwen2},      {"qwen3", Family::Qwen3},
    {"gemma3", Family::Gemma3},  {"phi3", Family::Phi3},        {"qwen3moe", Family::Qwen3Moe},
    {"gpt-oss", Family::GptOss}, {"qwen2moe", Family::Qwen2Moe}};

// "{arch}.*" keys the forward pass reads, or that cannot change what it computes
// (GGUF spec, "LLM" section). Anything else (rope.scaling.attn_factor, expert_count
// outside llama / qwen3moe, expert_weights_scale, attention.scale, logit softcapping of
// another family, ...) changes the model, so it is refused by name.
std::set<std::string> known_keys(Family fam) {
  std::set<std::string> k = {
      "block_count",         "context_length",       "embedding_length",
      "feed_forward_length", "attention.head_count", "attention.head_count_kv",
      "rope.freq_base",      "rope.dimension_count", "attention.layer_norm_rms_epsilon",
      "vocab_size",          "attention.key_length", "attention.value_length",
      "rope.scaling.type",   "rope.scaling.factor"};
  // Only selects LongRoPE factors (rope_factors_* tensors, refused as unknown) or
  // feeds YaRN (refused by type), so harmless without them; llama.cpp's converter
  // writes it for every Phi-3 (original_max_position_embeddings).
  k.insert("rope.scaling.original_context_length");
  if (fam == Family::Llama || fam == Family::Phi3 || fam == Family::Gemma3) {
    k.insert("attention.sliding_window");
  }
  if (fam == Family::Gemma3) {
    k.insert("rope.freq_base_swa");
    k.insert("final_logit_softcapping");
  }
  if (fam == Family::GptOss) k.merge(gptoss_keys());
  k.merge(moe_keys(fam));
  return k;
}

void refuse_unknown_keys(const gguf::File& f, const std::string& prefix, Family fam) {
  const std::set<std::string> known = known_keys(fam);
  for (const auto& [key, value] : f.metadata()) {
    if (key.rfind(prefix, 0) == 0 && !known.count(key.substr(prefix.size()))) {
      throw UnsupportedModel(
          "{}: metadata key '{}' is not supported by the reference for architecture '{}' "
          "(computing the model without it would be silently wrong)",
          f.path(), key, prefix.substr(0, prefix.size() - 1));
    }
  }
}

void refuse_unknown_tensors(const gguf::File& f, const ModelConfig& c) {
  const std::vector<std::string> names = expected_tensor_names(c);
  const std::set<std::string> expected(names.begin(), names.end());
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!expected.count(t.name)) {
      throw UnsupportedModel(
          "{}: tensor '{}' is not supported by the reference for architecture '{}' (computing "
          "the model without it would be silently wrong)",
          f.path(), t.name, c.architecture);
    }
  }
}

// rope.scaling.type: "none" or "linear" (HF rope_type "linear": positions / factor).
// "yarn", "longrope" and anything else are refused by value.
double read_rope_scale(const gguf::File& f, const std::string& p) {
  const auto type = f.find_string(p + "rope.scaling.type");
  const auto factor = f.find_float(p + "rope.scaling.factor");
  if (!type || *type == "none") {
    if (factor && *factor != 1.0 && *factor != 0.0) {
      throw UnsupportedModel("{}: {}rope.scaling.factor {} without a rope.scaling.type", f.path(),
                             p, *factor);
    }
    return 1.0;
  }
  if (*type != "linear") {
    throw UnsupportedModel(
        "{}: metadata key '{}rope.scaling.type' = '{}' is not supported (only 'none' and "
        "'linear')",
        f.path(), p, *type);
  }
  if (!factor || !(*factor >= 1.0) || !std::isfinite(*factor)) {
    throw Error("{}: {}rope.scaling.type 'linear' needs rope.scaling.factor >= 1 (got {})",
                f.path(), p, factor ? fmt::format("{}", *factor) : std::string("none"));
  }
  return *factor;
}

void read_shapes(const gguf::File& f, const std::string& p, ModelConfig& c) {
  auto req = [&](const char* k) { return positive_i32(f, p + k, f.get_uint(p + k)); };
  c.n_layer = req("block_count");
  c.n_embd = req("embedding_length");
  c.n_ff = req("feed_forward_length");
  c.n_head = req("attention.head_count");
  c.n_head_kv = c.n_head;
  if (auto v = f.find_uint(p + "attention.head_count_kv")) {
    c.n_head_kv = positive_i32(f, p + "attention.head_count_kv", *v);
  }
  c.n_ctx_train = req("context_length");
  if (auto v = f.find_float(p + "rope.freq_base")) c.rope_freq_base = static_cast<float>(*v);
  c.rms_norm_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon"));
  if (c.n_head % c.n_head_kv != 0) {
    throw Error("{}: {}attention.head_count {} is not a multiple of head_count_kv {}", f.path(), p,
                c.n_head, c.n_head_kv);
  }
  // head_dim: attention.key_length when present (Qwen3, Gemma 3), else n_embd / n_head.
  if (auto v = f.find_uint(p + "attention.key_length")) {
    c.head_dim = positive_i32(f, p + "attention.key_length", *v);
  } else if (c.n_embd % c.n_head != 0) {
    throw Error("{}: {}embedding_length {} is not a multiple of attention.head_count {}", f.path(),
                p, c.n_embd, c.n_head);
  } else {
    c.head_dim = c.n_embd / c.n_head;
  }
  if (auto v = f.find_uint(p + "attention.value_length"); v && *v != uint64_t(c.head_dim)) {
    throw UnsupportedModel("{}: {}attention.value_length {} != key_length {} (not supported)",
                           f.path(), p, *v, c.head_dim);
  }
  c.n_rot = c.head_dim;
  if (auto v = f.find_uint(p + "rope.dimension_count")) {
    c.n_rot = positive_i32(f, p + "rope.dimension_count", *v);
  }
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    throw Error("{}: {}rope.dimension_count {} must be even and <= head dim {}", f.path(), p,
                c.n_rot, c.head_dim);
  }
  if (!(c.rope_freq_base > 0.0f) || !(c.rms_norm_eps > 0.0f)) {
    throw Error("{}: rope.freq_base ({}) and layer_norm_rms_epsilon ({}) must be positive",
                f.path(), c.rope_freq_base, c.rms_norm_eps);
  }
  if (auto v = f.find_uint(p + "vocab_size")) {
    c.n_vocab = positive_i32(f, p + "vocab_size", *v);
  } else {
    c.n_vocab = positive_i32(f, "tokenizer.ggml.tokens",
                             f.get_string_array("tokenizer.ggml.tokens").size());
  }
}

// Family-specific structure (llama.cpp llm_build_* and the HF modeling_*.py files).
void read_family(const gguf::File& f, const std::string& p, ModelConfig& c) {
  const double scale = c.family == Family::GptOss ? 1.0 : read_rope_scale(f, p);  // YaRN
  int32_t window = 0;
  if (auto v = f.find_uint(p + "attention.sliding_window")) {
    window = positive_i32(f, p + "attention.sliding_window", *v);
  }
  c.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  c.layers.assign(size_t(c.n_layer), LayerConfig{c.rope_freq_base, scale, window});
  switch (c.family) {
    case Family::Llama:
      c.rope_freq_factors = f.find_tensor("rope_freqs.weight") != nullptr;
      if (c.n_rot != c.head_dim) {
        throw UnsupportedModel(
            "{}: {}rope.dimension_count {} != head dim {} (partial rotary with "
            "interleaved RoPE is not supported)",
            f.path(), p, c.n_rot, c.head_dim);
      }
      break;
    case Family::Qwen2:
      c.rope_style = RopeStyle::NeoX;
      c.qkv_bias = true;
      break;
    case Family::Qwen2Moe:  // llama.cpp src/models/qwen2moe.cpp: Qwen2's attention, whose
      // Q/K/V biases are optional there (create_tensor_qkv); HF Qwen2MoeAttention has them
      // when config.qkv_bias (true for every released Qwen2-MoE)
      c.rope_style = RopeStyle::NeoX;
      c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
      break;
    case Family::Qwen3:
    case Family::Qwen3Moe:  // llama.cpp src/models/qwen3moe.cpp: Qwen3's attention
      c.rope_style = RopeStyle::NeoX;
      c.qk_norm = true;
      break;
    case Family::Phi3:
      c.rope_style = RopeStyle::NeoX;
      c.fused_qkv = f.find_tensor("blk.0.attn_qkv.weight") != nullptr;
      c.fused_gate_up = f.find_tensor("blk.0.ffn_gate.weight") == nullptr;
      break;
    case Family::GptOss:
      read_gptoss(f, p, c);
      break;
    case Family::Gemma3: {
      // HF Gemma3TextModel / llama.cpp llm_build_gemma3_iswa.
      c.rope_style = RopeStyle::NeoX;
      c.ffn_activation = FfnActivation::GeluTanh;
      c.qk_norm = true;
      c.post_norms = true;
      // HF multiplies by embed_scale = hidden_size**0.5 stored as an fp32 buffer.
      c.embd_scale = double(static_cast<float>(std::sqrt(double(c.n_embd))));
      // query_pre_attn_scalar is not in GGUF; llama.cpp uses head_dim, except for the
      // 27B model (62 layers), whose query_pre_attn_scalar is n_embd / n_head.
      const double qpas = c.n_layer == 62 ? double(c.n_embd) / c.n_head : double(c.head_dim);
      c.attn_scale = 1.0 / std::sqrt(qpas);
      if (auto v = f.find_float(p + "final_logit_softcapping")) c.final_logit_softcap = *v;
      // Every 6th layer (l % 6 == 5) is global: full attention, rope.freq_base, linear
      // scaling. The others attend to the last `sliding_window` positions with
      // rope_local_base_freq (10000 unless rope.freq_base_swa says otherwise), unscaled.
      const double local_base = f.find_float(p + "rope.freq_base_swa").value_or(10000.0);
      if (window == 0) throw Error("{}: {}attention.sliding_window is required", f.path(), p);
      for (int32_t l = 0; l < c.n_layer; ++l) {
        if (l % 6 != 5)
          c.layers[size_t(l)] = LayerConfig{local_base, 1.0, window};
        else
          c.layers[size_t(l)].sliding_window = 0;
      }
      break;
    }
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
}

}  // namespace

const char* family_name(Family fam) {
  switch (fam) {
    case Family::Llama:
      return "llama";
    case Family::Qwen2:
      return "qwen2";
    case Family::Qwen3:
      return "qwen3";
    case Family::Gemma3:
      return "gemma3";
    case Family::Phi3:
      return "phi3";
    case Family::Qwen3Moe:
      return "qwen3moe";
    case Family::GptOss:
      return "gpt-oss";
    case Family::Qwen2Moe:
      return "qwen2moe";
  }
  return "?";
}

// Canonical feature names (the ABI's model_features, docs/model-families.md) with the
// words the error messages use.
static const std::vector<std::pair<std::string, std::string>>& feature_table() {
  static const std::vector<std::pair<std::string, std::string>> t = {
      {"neox_rope", "NeoX RoPE"},
      {"partial_rotary", "partial rotary"},
      {"key_length_head_dim", "head_dim from attention.key_length"},
      {"rope_freqs", "rope_freqs (llama3 RoPE scaling)"},
      {"linear_rope_scaling", "linear RoPE scaling"},
      {"sliding_window", "sliding-window attention"},
      {"per_layer_rope_base", "per-layer RoPE base"},
      {"qkv_bias", "QKV bias"},
      {"qk_norm", "QK-norm"},
      {"post_norms", "post-attention/post-FFN norms"},
      {"fused_qkv", "fused QKV"},
      {"fused_gate_up", "fused gate/up"},
      {"geglu", "GeGLU (tanh GELU)"},
      {"embedding_scale", "embedding scale"},
      {"attention_scale", "attention scale"},
      {"final_logit_softcap", "final logit soft-capping"},
      {"moe", "mixture-of-experts FFN (softmax top-k router)"},
      {"yarn_rope", "YaRN RoPE scaling"},
      {"attn_output_bias", "attention output bias"},
      {"attention_sinks", "attention sinks"},
      {"moe_topk_softmax", "MoE router: softmax over the top-k logits"},
      {"moe_biases", "router and expert biases"},
      {"swiglu_oai", "clamped SwiGLU (gpt-oss)"},
      {"moe_shared_expert", "MoE shared expert (sigmoid-gated)"},
  };
  return t;
}

std::vector<std::string> ModelConfig::feature_names() const {
  bool scaled = false, windowed = false, per_layer_base = false;
  for (const LayerConfig& l : layers) {
    scaled |= l.rope_scale != 1.0;
    windowed |= l.sliding_window != 0;
    per_layer_base |= l.rope_base != double{rope_freq_base};
  }
  const bool has[] = {rope_style != RopeStyle::Interleaved,
                      n_rot != head_dim,
                      head_dim * n_head != n_embd,
                      rope_freq_factors,
                      scaled,
                      windowed,
                      per_layer_base,
                      qkv_bias,
                      qk_norm,
                      post_norms,
                      fused_qkv,
                      fused_gate_up,
                      ffn_activation != FfnActivation::SiLU,
                      embd_scale != 1.0,
                      attn_scale != 1.0 / std::sqrt(double(head_dim)),
                      final_logit_softcap != 0.0,
                      is_moe(),
                      rope_yarn.factor != 0.0,
                      attn_out_bias,
                      attn_sinks,
                      is_moe() && moe.router == MoeRouter::TopKSoftmax,
                      is_moe() && moe.biases,
                      is_moe() && moe.activation == ExpertActivation::SwiGLUOai,
                      is_moe() && moe.n_ff_shexp > 0};
  std::vector<std::string> out;
  for (size_t i = 0; i < feature_table().size(); ++i)
    if (has[i]) out.push_back(feature_table()[i].first);
  return out;
}

std::string feature_description(const std::string& name) {
  for (const auto& [n, words] : feature_table())
    if (n == name) return words;
  return name;
}

namespace {
bool in_list(std::string_view list, std::string_view name) {
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (list.substr(start, end - start) == name) return true;
    start = end + 1;
  }
  return false;
}
}  // namespace

std::string unsupported_features(const ModelConfig& c, std::string_view architectures,
                                 std::string_view features) {
  std::vector<std::string> missing;
  if (!in_list(architectures, c.architecture))
    missing.push_back(fmt::format("architecture '{}'", c.architecture));
  for (const std::string& f : c.feature_names())
    if (!in_list(features, f)) missing.push_back(feature_description(f));
  return fmt::format("{}", fmt::join(missing, ", "));
}

std::string ModelConfig::extra_features() const {
  std::vector<std::string> f;
  if (family != Family::Llama) f.push_back(fmt::format("architecture '{}'", architecture));
  for (const std::string& n : feature_names()) f.push_back(feature_description(n));
  return fmt::format("{}", fmt::join(f, ", "));
}

bool ModelConfig::is_plain_llama() const { return extra_features().empty(); }

const char* ffn_norm_tensor(const ModelConfig& c) {
  return c.family == Family::GptOss ? "post_attention_norm.weight" : "ffn_norm.weight";
}

std::vector<std::string> expected_tensor_names(const ModelConfig& c) {
  std::vector<std::string> n = {"token_embd.weight", "output_norm.weight"};
  if (!c.tied_embeddings) n.emplace_back("output.weight");
  if (c.rope_freq_factors) n.emplace_back("rope_freqs.weight");
  for (int32_t l = 0; l < c.n_layer; ++l) {
    auto add = [&](const char* part) { n.push_back(fmt::format("blk.{}.{}", l, part)); };
    add("attn_norm.weight");
    if (c.fused_qkv) {
      add("attn_qkv.weight");
    } else {
      add("attn_q.weight");
      add("attn_k.weight");
      add("attn_v.weight");
    }
    if (c.qkv_bias) {
      add("attn_q.bias");
      add("attn_k.bias");
      add("attn_v.bias");
    }
    if (c.qk_norm) {
      add("attn_q_norm.weight");
      add("attn_k_norm.weight");
    }
    add("attn_output.weight");
    if (c.attn_out_bias) add("attn_output.bias");
    if (c.attn_sinks) add("attn_sinks.weight");
    if (c.post_norms) add("post_attention_norm.weight");
    n.push_back(fmt::format("blk.{}.{}", l, ffn_norm_tensor(c)));
    if (c.is_moe()) {  // llama.cpp LLM_TENSOR_FFN_GATE_INP, LLM_TENSOR_FFN_*_EXPS
      for (const char* part : {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
        add(fmt::format("{}.weight", part).c_str());
        if (c.moe.biases) add(fmt::format("{}.bias", part).c_str());
      }
      if (c.moe.n_ff_shexp > 0) {  // llama.cpp LLM_TENSOR_FFN_*_SHEXP
        for (const char* part :
             {"ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"})
          add(fmt::format("{}.weight", part).c_str());
      }
    } else {
      if (!c.fused_gate_up) add("ffn_gate.weight");
      add("ffn_up.weight");
      add("ffn_down.weight");
    }
    if (c.post_norms) add("post_ffw_norm.weight");
  }
  return n;
}

ModelConfig read_model_config(const gguf::File& f) {
  ModelConfig c;
  c.architecture = f.get_string("general.architecture");
  const auto it = kFamilies.find(c.architecture);
  if (it == kFamilies.end()) {
    throw UnsupportedModel(
        "{}: metadata key 'general.architecture': '{}' is not supported (supported: llama, "
        "qwen2, qwen3, gemma3, phi3, qwen3moe, gpt-oss, qwen2moe)",
        f.path(), c.architecture);
  }
  c.family = it->second;
  const std::string p = c.architecture + ".";
  read_shapes(f, p, c);
  read_family(f, p, c);
  read_moe(f, p, c);
  refuse_unknown_keys(f, p, c.family);
  refuse_unknown_tensors(f, c);
  return c;
}

}  // namespace touchstone
