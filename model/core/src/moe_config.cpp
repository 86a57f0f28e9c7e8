// moe_config.cpp - MoeConfig from GGUF metadata; see moe_config.h and
// touchstone/model/model_config.h.
//
// Keys as llama.cpp's convert_hf_to_gguf.py writes them (gguf-py Keys.LLM.EXPERT_*) and
// as src/llama-model.cpp reads them (load_hparams: LLM_KV_EXPERT_COUNT,
// LLM_KV_EXPERT_USED_COUNT; qwen3moe: LLM_KV_EXPERT_FEED_FORWARD_LENGTH).
#include "moe_config.h"

#include <limits>

#include "touchstone/model/gguf.h"

namespace touchstone {

std::set<std::string> moe_keys(Family fam) {
  // Mixtral: the converter's LlamaModel writes num_local_experts / num_experts_per_tok.
  if (fam == Family::Llama) return {"expert_count", "expert_used_count"};
  // Qwen3-MoE: Qwen2MoeModel adds moe_intermediate_size. expert_weights_norm
  // (norm_topk_prob) is not written by the converter for qwen3moe; read when present.
  if (fam == Family::Qwen3Moe) {
    return {"expert_count", "expert_used_count", "expert_feed_forward_length",
            "expert_weights_norm"};
  }
  // gpt-oss: GptOssModel writes intermediate_size as expert_feed_forward_length, which
  // llama.cpp requires (LLM_ARCH_OPENAI_MOE load_hparams).
  if (fam == Family::GptOss)
    return {"expert_count", "expert_used_count", "expert_feed_forward_length"};
  // Qwen2-MoE: Qwen2MoeModel writes moe_intermediate_size and
  // shared_expert_intermediate_size (llama_model_qwen2moe::load_arch_hparams reads both,
  // optional). No expert_weights_norm: llama.cpp never renormalises there.
  if (fam == Family::Qwen2Moe) {
    return {"expert_count", "expert_used_count", "expert_feed_forward_length",
            "expert_shared_feed_forward_length"};
  }
  return {};
}

namespace {

int32_t count(const gguf::File& f, const std::string& key, uint64_t v, uint64_t max) {
  if (v == 0 || v > max) {
    throw Error("{}: metadata key '{}': value {} out of range (1..{})", f.path(), key, v, max);
  }
  return static_cast<int32_t>(v);
}

// expert_feed_forward_length, else n_ff / n_expert_used (llama.cpp's qwen3moe and
// qwen2moe load_arch_tensors).
int32_t expert_width(const gguf::File& f, const std::string& p, const ModelConfig& c) {
  if (auto v = f.find_uint(p + "expert_feed_forward_length"))
    return count(f, p + "expert_feed_forward_length", *v, std::numeric_limits<int32_t>::max());
  const int32_t w = c.n_ff / c.moe.n_expert_used;
  if (w < 1) throw Error("{}: {}expert_feed_forward_length is required", f.path(), p);
  return w;
}

}  // namespace

void read_moe(const gguf::File& f, const std::string& p, ModelConfig& c) {
  if (moe_keys(c.family).empty()) return;  // its expert_* keys are refused as unknown
  MoeConfig& m = c.moe;
  const auto n_expert = f.find_uint(p + "expert_count");
  const auto n_used = f.find_uint(p + "expert_used_count");
  if (c.family == Family::Llama && (!n_expert || *n_expert == 0)) {
    // Dense Llama (llama.cpp: n_expert == 0). A top-k without experts means nothing.
    if (n_used && *n_used != 0) {
      throw Error("{}: {}expert_used_count {} without {}expert_count", f.path(), p, *n_used, p);
    }
    return;
  }
  if (!n_expert || !n_used) {
    throw Error("{}: {}expert_count and {}expert_used_count are required", f.path(), p, p);
  }
  constexpr uint64_t kMax = std::numeric_limits<int32_t>::max();
  m.n_expert = count(f, p + "expert_count", *n_expert, kMax);
  m.n_expert_used = count(f, p + "expert_used_count", *n_used, uint64_t(m.n_expert));
  m.n_ff_exp = c.n_ff;  // llama: ffn_*_exps are {n_embd, n_ff, n_expert} (llama.cpp)
  m.norm_topk = true;   // HF MixtralSparseMoeBlock always renormalises
  if (c.family == Family::Qwen3Moe) {
    // llama.cpp src/models/qwen3moe.cpp: n_ff_exp = expert_feed_forward_length, else
    // n_ff / n_expert_used.
    m.n_ff_exp = expert_width(f, p, c);
    // HF Qwen3MoeSparseMoeBlock renormalises only if config.norm_topk_prob. llama.cpp
    // (0.3.16 and 0.3.36) always does (build_moe_ffn(..., norm_w = true, ...)) and its
    // converter does not write the key; every released Qwen3-MoE has norm_topk_prob =
    // true. So: the key when present, else true, as llama.cpp.
    if (auto v = f.find_bool(p + "expert_weights_norm")) m.norm_topk = *v;
  }
  if (c.family == Family::GptOss) read_gptoss_moe(f, p, c);
  if (c.family == Family::Qwen2Moe) read_qwen2moe_moe(f, p, c);
}

// Qwen2-MoE (HF Qwen2MoeSparseMoeBlock; llama.cpp src/models/qwen2moe.cpp): n_ff_exp =
// expert_feed_forward_length, else n_ff / n_expert_used; the shared expert's width =
// expert_shared_feed_forward_length, else n_ff; build_moe_ffn(..., norm_w = false, ...,
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX): softmax, top-k, not renormalised (HF
// norm_topk_prob, default false; llama.cpp has no key for it and never renormalises).
void read_qwen2moe_moe(const gguf::File& f, const std::string& p, ModelConfig& c) {
  MoeConfig& m = c.moe;
  constexpr uint64_t kMax = std::numeric_limits<int32_t>::max();
  m.n_ff_exp = expert_width(f, p, c);
  m.n_ff_shexp = c.n_ff;
  if (auto v = f.find_uint(p + "expert_shared_feed_forward_length"))
    m.n_ff_shexp = count(f, p + "expert_shared_feed_forward_length", *v, kMax);
  m.norm_topk = false;
}

// gpt-oss (HF GptOssMLP, GptOssTopKRouter, GptOssExperts; llama.cpp build_moe_ffn with
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, norm_w = false, LLM_FFN_SWIGLU_OAI_MOE and
// the router / expert biases of llm_build_openai_moe_iswa).
void read_gptoss_moe(const gguf::File& f, const std::string& p, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const auto v = f.find_uint(p + "expert_feed_forward_length");
  if (!v) throw Error("{}: {}expert_feed_forward_length is required", f.path(), p);
  m.n_ff_exp = count(f, p + "expert_feed_forward_length", *v, std::numeric_limits<int32_t>::max());
  m.router = MoeRouter::TopKSoftmax;  // the k weights sum to 1 by construction
  m.norm_topk = false;
  m.activation = ExpertActivation::SwiGLUOai;
  m.biases = true;
}

}  // namespace touchstone
