// gptoss_config.cpp - gpt-oss (GGUF architecture "gpt-oss", HF GptOssForCausalLM) from
// GGUF metadata; see gptoss_config.h.
//
// Sources: HF transformers models/gpt_oss/modeling_gpt_oss.py and configuration_gpt_oss.py
// (transformers 5.23); llama.cpp src/llama-model.cpp (LLM_ARCH_OPENAI_MOE: load_hparams,
// load_tensors, llm_build_openai_moe_iswa) and convert_hf_to_gguf.py GptOssModel, both of
// llama-cpp-python 0.3.16 (0.3.36 reads the same keys and tensors).
#include "gptoss_config.h"

#include <cmath>

#include "touchstone/model/gguf.h"

namespace touchstone {

std::set<std::string> gptoss_keys() {
  // The converter writes sliding_window and YaRN's type, factor and
  // original_context_length (common keys) and the expert keys (moe_keys); nothing else.
  return {"attention.sliding_window"};
}

namespace {

// rope.scaling.*: gpt-oss always has YaRN (the converter asserts rope_type == "yarn").
// beta_fast / beta_slow are not in GGUF: HF's defaults (32, 1), which the released
// config sets and llama.cpp uses (cparams yarn_beta_fast / yarn_beta_slow). truncate is
// not in GGUF either: the released config and GptOssConfig's default say
// "truncate": false (the correction range is not rounded); llama.cpp's
// ggml_rope_yarn_corr_dims always rounds it (floor / ceil), so llama.cpp differs there.
RopeYarn read_yarn(const gguf::File& f, const std::string& p) {
  const auto type = f.find_string(p + "rope.scaling.type");
  if (!type || *type != "yarn") {
    throw UnsupportedModel("{}: {}rope.scaling.type is '{}'; gpt-oss needs 'yarn'", f.path(), p,
                           type.value_or("(none)"));
  }
  RopeYarn y;
  const auto factor = f.find_float(p + "rope.scaling.factor");
  if (!factor || !(*factor >= 1.0) || !std::isfinite(*factor)) {
    throw Error("{}: {}rope.scaling.factor must be >= 1 for YaRN", f.path(), p);
  }
  y.factor = *factor;
  const auto orig = f.find_uint(p + "rope.scaling.original_context_length");
  if (!orig || *orig == 0 || *orig > (1u << 30)) {
    throw Error("{}: {}rope.scaling.original_context_length is required for YaRN (1..2^30)",
                f.path(), p);
  }
  y.orig_ctx = static_cast<int32_t>(*orig);
  y.truncate = false;
  return y;
}

void require_tensor(const gguf::File& f, const std::string& name, const char* what) {
  if (!f.find_tensor(name)) {
    throw Error("{}: tensor '{}' is missing ({} of gpt-oss)", f.path(), name, what);
  }
}

}  // namespace

void read_gptoss(const gguf::File& f, const std::string& p, ModelConfig& c) {
  // Attention (GptOssAttention; llm_build_openai_moe_iswa): NeoX RoPE (HF
  // _apply_rotary_emb rotates halves; llama.cpp LLAMA_ROPE_TYPE_NEOX), q/k/v/o biases
  // (attention_bias = true), a learned sink logit per head (build_attn_with_sinks), scale
  // 1/sqrt(head_dim).
  c.rope_style = RopeStyle::NeoX;
  c.qkv_bias = true;
  c.attn_out_bias = true;
  c.attn_sinks = true;
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    require_tensor(f, b + "attn_sinks.weight", "the attention sinks");
    require_tensor(f, b + "attn_output.bias", "the attention output bias");
  }
  c.rope_yarn = read_yarn(f, p);
  for (LayerConfig& lc : c.layers) lc.rope_scale = 1.0;
  // Layers alternate (GptOssConfig.layer_types: "sliding_attention" if (i + 1) % 2 else
  // "full_attention"; llama.cpp set_swa_pattern(2)): even layers attend to the last
  // sliding_window positions, odd layers to all.
  const auto window = f.find_uint(p + "attention.sliding_window");
  if (!window || *window == 0 || *window > (1u << 30)) {
    throw Error("{}: {}attention.sliding_window is required (1..2^30)", f.path(), p);
  }
  for (int32_t l = 0; l < c.n_layer; ++l)
    c.layers[size_t(l)].sliding_window = l % 2 == 0 ? static_cast<int32_t>(*window) : 0;
}

}  // namespace touchstone
