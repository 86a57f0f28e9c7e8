// engine_moe.cpp - the mixture-of-experts FFN of the cpu_simd engine (Mixtral-style:
// llama + llama.expert_count; Qwen3-MoE; gpt-oss), the reference's maths
// (reference/transformer/src/reference_ffn.cpp, moe_feed_forward), per token:
//   r = W_router h (+ b_router: gpt-oss)             (fp32, linears; bias added in fp32)
//   (e_j, w_j), j < k = ops::route_softmax_top_k(r, k, norm_topk)
//       fp64 softmax, the k largest (equal: lower expert index first), optionally
//       renormalised (touchstone/model/moe_router.h; HF MixtralSparseMoeBlock,
//       Qwen3MoeSparseMoeBlock; llama.cpp llm_graph_context::build_moe_ffn)
//     gpt-oss: ops::route_top_k_softmax(r, k): the k largest logits, softmax over
//       them (HF modeling_gpt_oss.py GptOssTopKRouter)
//   f = sum_j w_j * Wdown_e_j (act(Wgate_e_j h) * (Wup_e_j h))
//       each expert's gated FFN as the dense one (fp32 matmuls, act in fp64 rounded
//       once), the k terms summed in fp64 in the router's order j = 0, 1, ..., k-1
//       from 0.0, rounded once to fp32 (the reference's order and roundings).
//     qwen2moe: + sigmoid(w_shexp . h) * Wdown_s (act(Wgate_s h) * (Wup_s h)), the shared
//       expert (HF Qwen2MoeSparseMoeBlock; llama.cpp src/models/qwen2moe.cpp) over every
//       token of the pass as a dense FFN, its gate logit an fp64 dot rounded to fp32,
//       the sigmoid in fp64, the term added to the fp64 sum after the k routed experts.
//     gpt-oss: f = sum_j w_j * (Wdown_e_j swiglu_oai(Wgate_e_j h + bg, Wup_e_j h + bu) + bd)
//       (HF GptOssExperts; llama.cpp build_moe_ffn with ggml_add_id and
//       ggml_swiglu_oai): each bias added in fp32 to the rounded matmul output, the
//       clamped SwiGLU touchstone::ops::swiglu_oai itself (fp64, rounded once).
// The pass's tokens are grouped by expert: each chosen expert's matrices run once
// over the gathered rows of the tokens that chose it (linears: the dense FFN's
// kernels on the expert's row range of the 3-D tensor; on full precision the
// matvec per token, not sgemm, whose bits depend on the token count). Every output
// of those kernels is then the same operation sequence for any token count and row
// range, and everything else here is per token, so a token's expert outputs do not
// depend on which other tokens or sessions share its pass (batch invariance on the
// quantized path, content isolation on both: docs/backends/cpu_simd.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "engine.h"
#include "engine_ops.h"
#include "touchstone/model/moe_router.h"
#include "touchstone/model/scalar_ops.h"

namespace touchstone::cpu_simd {

void SimdSession::moe_ffn(int32_t l) {
  const LayerView& L = w_->layers[size_t(l)];
  const size_t d = size_t(c_.n_embd), N = size_t(n_tok_), k = size_t(c_.moe.n_expert_used);
  moe_route(L);
  for (int32_t e = 0; e < c_.moe.n_expert; ++e) {
    const int32_t first = moe_count_[size_t(e)], n = moe_count_[size_t(e) + 1] - first;
    if (n > 0) moe_expert(L, e, moe_slots_.data() + first, size_t(n));
  }
  const bool shared = L.shexp_gate != nullptr;
  if (shared) moe_shared_expert(L);
  // f = sum_j w_j * out_j (+ the shared expert's term) in fp64, in the router's order,
  // rounded once.
  pool_.run(N, [&](size_t i, int) {
    const double* w = moe_weight_.data() + i * k;
    const float* out = moe_out_.data() + i * k * d;
    const float* sh = shared ? moe_shared_.data() + i * d : nullptr;
    for (size_t c = 0; c < d; ++c) {
      double acc = 0.0;
      for (size_t j = 0; j < k; ++j) acc += w[j] * double{out[j * d + c]};
      if (sh) acc += moe_shared_gate_[i] * double{sh[c]};
      tmp_[i * d + c] = static_cast<float>(acc);
    }
  });
}

// The shared expert (qwen2moe) on every token of the pass: its gated FFN into
// moe_shared_, its gate sigmoid(fp32(w_shexp . h)) into moe_shared_gate_.
void SimdSession::moe_shared_expert(const LayerView& L) {
  const size_t d = size_t(c_.n_embd), N = size_t(n_tok_), fs = size_t(c_.moe.n_ff_shexp);
  gated_ffn(L.gate_shexp, L.up_shexp, L.down_shexp, fs, moe_shared_.data());
  for (size_t i = 0; i < N; ++i) {
    const float g =
        static_cast<float>(touchstone::ops::dot(L.shexp_gate, xn_.data() + i * d, int64_t(d)));
    moe_shared_gate_[i] = 1.0 / (1.0 + std::exp(-double{g}));
  }
}

// Router logits of every token (one linears call), each token's k experts and
// weights (slot i * k + j: token i's j-th choice), then the slots grouped by expert
// in token order: expert e's slots are moe_slots_[moe_count_[e], moe_count_[e + 1]).
void SimdSession::moe_route(const LayerView& L) {
  const size_t d = size_t(c_.n_embd), N = size_t(n_tok_), ne = size_t(c_.moe.n_expert);
  const size_t k = size_t(c_.moe.n_expert_used);
  const Job router[1] = {{&L.router, moe_logits_.data(), ne}};
  linears(router, 1, xn_.data(), d, N);
  const bool topk_softmax = c_.moe.router == touchstone::MoeRouter::TopKSoftmax;
  pool_.run(N, [&](size_t i, int) {
    float* r = moe_logits_.data() + i * ne;
    if (L.router_b) ops::add_bias(r, L.router_b, ne);
    const std::span<const float> logits(r, ne);
    const std::vector<touchstone::ops::ExpertWeight> chosen =
        topk_softmax ? touchstone::ops::route_top_k_softmax(logits, int32_t(k))
                     : touchstone::ops::route_softmax_top_k(logits, int32_t(k), c_.moe.norm_topk);
    for (size_t j = 0; j < k; ++j) {
      moe_expert_[i * k + j] = chosen[j].expert;
      moe_weight_[i * k + j] = chosen[j].weight;
    }
  });
  std::fill(moe_count_.begin(), moe_count_.end(), 0);
  for (size_t s = 0; s < N * k; ++s) ++moe_count_[size_t(moe_expert_[s]) + 1];
  for (size_t e = 0; e < ne; ++e) moe_count_[e + 1] += moe_count_[e];
  std::vector<int32_t>& next = moe_fill_;
  next.assign(moe_count_.begin(), moe_count_.end() - 1);
  for (size_t s = 0; s < N * k; ++s)
    moe_slots_[size_t(next[size_t(moe_expert_[s])]++)] = int32_t(s);
}

// Expert e's gated FFN on the n tokens of `slots` (gathered into moe_x_), each
// output row written to its slot of moe_out_.
void SimdSession::moe_expert(const LayerView& L, int32_t e, const int32_t* slots, size_t n) {
  const size_t d = size_t(c_.n_embd), fe = size_t(c_.moe.n_ff_exp);
  const size_t k = size_t(c_.moe.n_expert_used);
  for (size_t r = 0; r < n; ++r) {
    const size_t i = size_t(slots[r]) / k;
    std::memcpy(moe_x_.data() + r * d, xn_.data() + i * d, d * sizeof(float));
  }
  const size_t x = size_t(e);
  const Job gu[2] = {{&L.gate_exps[x], gate_.data(), fe}, {&L.up_exps[x], up_.data(), fe}};
  linears(gu, 2, moe_x_.data(), d, n, true);
  if (c_.moe.activation == touchstone::ExpertActivation::SwiGLUOai)
    swiglu_oai_activation(n, fe, L.gate_exps_b ? L.gate_exps_b + x * fe : nullptr,
                          L.up_exps_b ? L.up_exps_b + x * fe : nullptr);
  else
    gated_activation(n, fe);
  // tmp_ is free until moe_ffn's sum: the expert's rows, then copied to their slots.
  const Job dn[1] = {{&L.down_exps[x], tmp_.data(), d}};
  linears(dn, 1, gate_.data(), fe, n, true);
  if (L.down_exps_b) {
    for (size_t r = 0; r < n; ++r) ops::add_bias(tmp_.data() + r * d, L.down_exps_b + x * d, d);
  }
  for (size_t r = 0; r < n; ++r)
    std::memcpy(moe_out_.data() + size_t(slots[r]) * d, tmp_.data() + r * d, d * sizeof(float));
}

// gate_[t][j] = fp32(swiglu_oai(g + bg[j], u + bu[j])) for n_tok rows of width ff, g and
// u the rounded matmul outputs (the biases added in fp32 first, may be null):
// touchstone::ops::swiglu_oai (HF GptOssExperts: gate.clamp(max=limit), up.clamp(-limit,
// limit), (up + 1) * gate * sigmoid(gate * alpha)), in fp64 as the reference.
void SimdSession::swiglu_oai_activation(size_t n_tok, size_t ff, const float* bg, const float* bu) {
  pool_.run(n_tok, [&](size_t i, int) {
    float* g = gate_.data() + i * ff;
    float* u = up_.data() + i * ff;
    if (bg) ops::add_bias(g, bg, ff);
    if (bu) ops::add_bias(u, bu, ff);
    for (size_t j = 0; j < ff; ++j)
      g[j] = static_cast<float>(touchstone::ops::swiglu_oai(double{g[j]}, double{u[j]}));
  });
}

}  // namespace touchstone::cpu_simd
