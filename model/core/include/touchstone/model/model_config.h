// touchstone/model/model_config.h - every supported decoder-only family, described as data.
//
// One ModelConfig drives the one scalar forward pass (reference_forward.cpp); there is
// no per-architecture copy of it. Values come from GGUF metadata (ggml/docs/gguf.md,
// "LLM" section; key prefix = general.architecture) and from the tensors present,
// interpreted as llama.cpp's src/llama-model.cpp does, and each feature follows the
// Hugging Face transformers module named beside it.
//
// Families (general.architecture):
//   llama   LlamaForCausalLM (Llama 1/2/3/3.1/3.2, Mistral 7B-style, SmolLM): interleaved
//           RoPE on converter-permuted Q/K, optional rope_freqs.weight (llama3 scaling),
//           optional linear RoPE scaling, optional sliding window (Mistral); with
//           llama.expert_count, MixtralForCausalLM (mixture-of-experts FFN, MoeConfig).
//   qwen2   Qwen2ForCausalLM: NeoX RoPE, Q/K/V biases.
//   qwen3   Qwen3ForCausalLM: NeoX RoPE, per-head QK RMSNorm, head_dim from key_length.
//   gemma3  Gemma3ForCausalLM (text): NeoX RoPE, QK-norm, post-attention and post-FFN
//           norms, GeGLU (tanh GELU), embeddings scaled by sqrt(n_embd), sliding window
//           on 5 of every 6 layers with their own RoPE base, attention scale from the
//           model, optional final logit soft-capping.
//   phi3    Phi3ForCausalLM: NeoX RoPE, fused QKV and fused gate|up projections
//           (split at load), optional sliding window.
//   qwen3moe Qwen3MoeForCausalLM: Qwen3's attention with a mixture-of-experts FFN.
//   qwen2moe Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (NeoX
//           RoPE, Q/K/V biases) with a mixture of experts whose top-k weights are not
//           renormalised, plus a shared expert gated by sigmoid(w . h).
//   gpt-oss GptOssForCausalLM: NeoX RoPE with YaRN scaling, Q/K/V/O biases, attention
//           sinks, sliding window on every other layer (0, 2, ...), and a mixture of
//           experts with a top-k-then-softmax router, router and expert biases and the
//           clamped SwiGLU (gptoss_config.cpp has the sources).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/common/error.h"

namespace touchstone {
namespace gguf {
class File;
}

enum class Family { Llama, Qwen2, Qwen3, Gemma3, Phi3, Qwen3Moe, GptOss, Qwen2Moe };
enum class RopeStyle { Interleaved, NeoX };   // see ops::rope_interleaved / ops::rope_neox
enum class FfnActivation { SiLU, GeluTanh };  // SwiGLU / GeGLU gate

const char* family_name(Family f);

// What varies from layer to layer (gemma.cpp's LayerConfig idea).
struct LayerConfig {
  double rope_base = 10000.0;  // RoPE theta base of this layer
  double rope_scale = 1.0;     // linear RoPE scaling factor (positions divided by it)
  int32_t sliding_window = 0;  // 0: full causal attention; W: attend to the last W positions
};

// Mixture-of-experts FFN (touchstone/model/moe_router.h has the router's maths): the
// dense gated FFN of every layer is replaced by n_expert gated FFNs of width n_ff_exp,
// of which the router picks n_expert_used per token (HF MixtralSparseMoeBlock,
// Qwen3MoeSparseMoeBlock; llama.cpp llm_graph_context::build_moe_ffn).
// Router kinds (touchstone/model/moe_router.h): softmax over all n_expert logits, then
// top-k (Mixtral, Qwen3-MoE); or top-k on the logits, then softmax over those k (gpt-oss).
enum class MoeRouter { SoftmaxTopK, TopKSoftmax };
// Expert activation: SwiGLU, or gpt-oss's clamped SwiGLU (ops::swiglu_oai).
enum class ExpertActivation { SwiGLU, SwiGLUOai };

struct MoeConfig {
  int32_t n_expert = 0;       // {arch}.expert_count; 0: dense FFN
  int32_t n_expert_used = 0;  // {arch}.expert_used_count (the router's top-k)
  int32_t n_ff_exp = 0;       // {arch}.expert_feed_forward_length (qwen3moe, gpt-oss), else n_ff
  bool norm_topk = true;      // renormalise the k selected weights to sum 1 (SoftmaxTopK)
  MoeRouter router = MoeRouter::SoftmaxTopK;
  ExpertActivation activation = ExpertActivation::SwiGLU;
  bool biases = false;  // blk.N.ffn_gate_inp.bias, ffn_{gate,up,down}_exps.bias (gpt-oss)
  // Shared expert (qwen2moe; HF Qwen2MoeSparseMoeBlock.shared_expert, llama.cpp
  // src/models/qwen2moe.cpp): a gated SwiGLU FFN of width n_ff_shexp that every token
  // runs, its output scaled by sigmoid(w_shexp . h) and added after the routed experts.
  // 0: none. {arch}.expert_shared_feed_forward_length, else n_ff (llama.cpp).
  int32_t n_ff_shexp = 0;
};

// YaRN RoPE scaling (HF modeling_rope_utils._compute_yarn_parameters; ggml rope_yarn):
// per rotary pair i (of n_rot / 2), with b = RoPE base and d = n_rot,
//   corr(r) = d * ln(orig_ctx / (2 pi r)) / (2 ln b);  lo = corr(beta_fast), hi = corr(beta_slow)
//   (truncate: lo = floor(lo), hi = ceil(hi)); lo = max(lo, 0), hi = min(hi, d - 1)
//   ramp_i = clamp((i - lo) / (hi - lo), 0, 1)        (hi == lo: hi += 0.001)
//   inv_freq_i = b^(-2i/d) * (ramp_i / factor + (1 - ramp_i))
// and cos, sin are multiplied by mscale = 0.1 ln(factor) + 1 (touchstone/model/rope_yarn.h).
struct RopeYarn {
  double factor = 0.0;   // rope.scaling.factor; 0: no YaRN
  int32_t orig_ctx = 0;  // rope.scaling.original_context_length
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;  // floor/ceil the correction range (HF default, ggml always)
};

struct ModelConfig {
  std::string architecture;  // general.architecture
  Family family = Family::Llama;
  int32_t n_layer = 0;      // {arch}.block_count
  int32_t n_embd = 0;       // {arch}.embedding_length (hidden size d)
  int32_t n_ff = 0;         // {arch}.feed_forward_length (gated FFN inner size)
  int32_t n_head = 0;       // {arch}.attention.head_count (query heads)
  int32_t n_head_kv = 0;    // {arch}.attention.head_count_kv (GQA groups; == n_head for MHA)
  int32_t head_dim = 0;     // {arch}.attention.key_length, else n_embd / n_head
  int32_t n_rot = 0;        // {arch}.rope.dimension_count, else head_dim (partial rotary if <)
  int32_t n_ctx_train = 0;  // {arch}.context_length
  int32_t n_vocab = 0;      // {arch}.vocab_size, else length of tokenizer.ggml.tokens
  float rope_freq_base = 10000.0f;  // {arch}.rope.freq_base (global layers)
  float rms_norm_eps = 1e-5f;       // {arch}.attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;     // output.weight absent: LM head = token_embd

  RopeStyle rope_style = RopeStyle::Interleaved;
  FfnActivation ffn_activation = FfnActivation::SiLU;
  bool rope_freq_factors = false;  // rope_freqs.weight present (llama3 scaling)
  bool qkv_bias = false;           // blk.N.attn_{q,k,v}.bias (Qwen2, gpt-oss)
  bool attn_out_bias = false;      // blk.N.attn_output.bias (gpt-oss)
  bool attn_sinks = false;         // blk.N.attn_sinks.weight: a logit per head (gpt-oss)
  bool qk_norm = false;        // blk.N.attn_{q,k}_norm.weight, RMSNorm per head (Qwen3, Gemma 3)
  bool post_norms = false;     // blk.N.post_attention_norm / post_ffw_norm (Gemma 3)
  bool fused_qkv = false;      // blk.N.attn_qkv.weight (Phi-3)
  bool fused_gate_up = false;  // blk.N.ffn_up.weight holds [gate; up] (Phi-3)
  double embd_scale = 1.0;     // token embedding multiplier (Gemma: sqrt(n_embd))
  double attn_scale = 0.0;     // attention score multiplier (default 1/sqrt(head_dim))
  double final_logit_softcap = 0.0;  // 0: none; else cap * tanh(logit / cap)
  RopeYarn rope_yarn;                // factor == 0 unless YaRN (gpt-oss)
  MoeConfig moe;                     // n_expert == 0 unless a mixture-of-experts model
  std::vector<LayerConfig> layers;   // n_layer entries

  bool is_moe() const { return moe.n_expert > 0; }

  // True for the configuration every backend of this repo computes: a "llama"
  // family model with interleaved RoPE, full rotary, SwiGLU, no scaling, no sliding
  // window, no biases or extra norms and the default attention scale.
  bool is_plain_llama() const;
  // Canonical names (docs/model-families.md, the ABI's model_features) of the
  // features this config uses beyond a plain Llama, e.g. {"neox_rope", "qk_norm"}.
  std::vector<std::string> feature_names() const;
  // Names the architecture (unless llama) and the features that make
  // is_plain_llama() false, in words, e.g. "architecture 'qwen3', NeoX RoPE, QK-norm".
  std::string extra_features() const;
};

// The words for a canonical feature name ("qk_norm" -> "QK-norm"); the name itself
// when unknown.
std::string feature_description(const std::string& name);

// What a backend leaves out of `c`: "architecture '<name>'" unless the
// architecture is in `architectures`, then the words of each feature of `c`
// (feature_names()) not in `features`, joined with ", "; empty when the backend
// computes all of `c`. Both lists are comma-separated canonical names, as a
// backend declares them in its ABI table (ts_backend_v3's architectures and
// model_features, docs/contract.md).
std::string unsupported_features(const ModelConfig& c, std::string_view architectures,
                                 std::string_view features);

// UnsupportedModel (touchstone/common/error.h): a model this reference does not compute.

// Reads and validates the config. Throws touchstone::Error naming the file and key
// when a key is missing, has the wrong type or an impossible value (n_head_kv not
// dividing n_head, ...), and UnsupportedModel naming the first metadata key of the
// architecture prefix outside the family's known set, the first tensor that is not
// a weight of the family's forward pass, or an unsupported architecture.
ModelConfig read_model_config(const gguf::File& file);

// The pre-FFN RMSNorm weight of layer l's block, after "blk.N.": "ffn_norm.weight";
// gpt-oss: "post_attention_norm.weight" (its converter maps HF post_attention_layernorm,
// the norm before the MoE block, to llama.cpp's LLM_TENSOR_ATTN_POST_NORM).
const char* ffn_norm_tensor(const ModelConfig& c);

// Every tensor name the forward pass reads for this config (the loader requires
// each; read_model_config refuses any other).
std::vector<std::string> expected_tensor_names(const ModelConfig& c);

}  // namespace touchstone
