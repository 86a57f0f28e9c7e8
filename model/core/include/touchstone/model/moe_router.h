// touchstone/model/moe_router.h - the router of a softmax top-k mixture-of-experts FFN.
//
// Given the router logits r = W_gate_inp h of one token (n_expert values):
//   p   = softmax(r)                                   (fp64, max subtracted)
//   S   = the k experts of largest p, in decreasing p; equal p: the lower expert index
//         first (a stable sort; see top_k_experts)
//   w_e = p_e / sum_{j in S} p_j  if renormalise, else p_e        (e in S)
// and the block's output is sum_{e in S} w_e * FFN_e(h).
//
// Sources:
//   Mixtral: HF transformers models/mixtral/modeling_mixtral.py, MixtralSparseMoeBlock
//     (MixtralTopKRouter): softmax(router_logits, dtype=float), torch.topk(top_k),
//     top_value /= top_value.sum(-1) (always renormalised).
//   Qwen3-MoE: HF models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeSparseMoeBlock
//     (Qwen3MoeTopKRouter): softmax, torch.topk(top_k), then divided by the sum only
//     `if self.norm_topk_prob`.
//   llama.cpp src/llama-graph.cpp, llm_graph_context::build_moe_ffn with
//     LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX: probs = ggml_soft_max(logits),
//     selected = ggml_argsort_top_k(probs, n_expert_used), weights = get_rows(probs,
//     selected), if norm_w: weights /= clamp(sum(weights), 6.1e-5, inf) (the clamp never
//     binds after a softmax: the top k of n probabilities sum to at least k/n).
//
// Ties: neither source defines an order for equal probabilities. torch.topk documents
// none, and on CPU (torch 2.15) it returns no consistent one: on random tied vectors
// (n = 4..128, k = 1..8) its set was the lower indices' in 22 %, the higher ones' in 12 %,
// neither in 66 %. ggml's CPU argsort is a selection sort in llama.cpp of
// llama-cpp-python 0.3.16 (lower indices' set in 90 % of those cases) and
// std::partial_sort in 0.3.36 (unspecified). The reference takes the lower expert index
// first (a stable sort): a defined order, which no source promises to match; the
// probabilities of distinct router rows tie with probability ~0 in real models.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace touchstone::ops {

struct ExpertWeight {
  int32_t expert = 0;  // index in [0, n_expert)
  double weight = 0.0;
};

// softmax over `logits` in fp64: exp(l_i - max) / sum_j exp(l_j - max), the sum taken
// in increasing index. A NaN logit makes every probability NaN.
std::vector<double> softmax(std::span<const float> logits);

// Indices of the k largest values, largest first; equal values: lower index first.
// NaN sorts after every number. Throws touchstone::Error unless 1 <= k <= size.
std::vector<int32_t> top_k_experts(std::span<const double> probs, int32_t k);

// The router: softmax, top-k, optional renormalisation (see the file comment).
std::vector<ExpertWeight> route_softmax_top_k(std::span<const float> logits, int32_t k,
                                              bool renormalise);

// gpt-oss's router, the other order: S = the k largest logits (equal: lower index first),
// w_e = exp(r_e - max_S) / sum_{j in S} exp(r_j - max_S) (fp64, in selection order).
// HF modeling_gpt_oss.py GptOssTopKRouter: router_logits = linear(h, weight, bias);
// torch.topk(router_logits, top_k); softmax(top_values). llama.cpp build_moe_ffn with
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT: probs = logits, ggml_top_k, then
// ggml_soft_max over the k selected. The logits include the router bias.
std::vector<ExpertWeight> route_top_k_softmax(std::span<const float> logits, int32_t k);

}  // namespace touchstone::ops
