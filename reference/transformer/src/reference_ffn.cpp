// reference_ffn.cpp - the FFN of the reference forward pass: the dense gated FFN and the
// mixture of experts (Mixtral, Qwen3-MoE, gpt-oss). Numerics as documented in
// reference_forward.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "reference_ops.h"
#include "touchstone/model/moe_router.h"
#include "touchstone/model/scalar_ops.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
using reference_ops::add_into;
using reference_ops::matvec;

namespace {

// The router with a mixture-of-experts fault (touchstone/model/faults.h), either router:
// p = softmax over every expert's logit (bias included), the top k of p (ties: lower
// index); moe_runner_up takes the (k+1)-th in place of the k-th; the weights p_e / sum_S p
// (what either family's router gives, up to rounding), or p_e as the softmax gave them
// with moe_renorm_skipped (for gpt-oss: the softmax taken before the top-k, not after).
// moe_softmax_order takes the softmax on the other side of the top-k: a family that
// takes it before and does not renormalise (qwen2moe) gets the softmax over its top k,
// p_e / sum_S p; gpt-oss (after) gets p_e; a family that renormalises gets its own
// weights back (the two orders are the same maths there). moe_shared_expert_dropped
// does not touch the router (moe_feed_forward).
std::vector<ops::ExpertWeight> faulty_route(std::span<const float> logits, const MoeConfig& m,
                                            const Faults& f) {
  const std::vector<double> p = ops::softmax(logits);
  const int32_t k = m.n_expert_used;
  std::vector<int32_t> top = ops::top_k_experts(p, std::min(k + 1, m.n_expert));
  if (f.moe_runner_up && k < m.n_expert) top[size_t(k - 1)] = top[size_t(k)];
  top.resize(size_t(k));
  double sum = 0;
  for (int32_t e : top) sum += p[size_t(e)];
  const bool family_renormalises = m.router == MoeRouter::TopKSoftmax || m.norm_topk;
  const bool renormalise = f.moe_softmax_order && !m.norm_topk
                               ? m.router == MoeRouter::SoftmaxTopK
                               : family_renormalises && !f.moe_renorm_skipped;
  std::vector<ops::ExpertWeight> out;
  for (int32_t e : top) out.push_back({e, renormalise ? p[size_t(e)] / sum : p[size_t(e)]});
  return out;
}

}  // namespace

// out = Wdown act(Wgate xn_ + bg, Wup xn_ + bu) + bd; act(g, u) = SiLU(g) u (SwiGLU),
// GELU_tanh(g) u (GeGLU) or ops::swiglu_oai(g, u) (gpt-oss); matrices as stored, Wgate and
// Wup [n_ff][n_embd], Wdown [n_embd][n_ff]; biases null unless gpt-oss. Uses gate_, up_.
void ReferenceTransformer::gated_ffn(const ExpertMatrices& m, int64_t n_ff, float* out) {
  const ModelConfig& c = w_.config;
  matvec(pool_, m.gate, xn_.data(), gate_.data(), faults_, m.gate_b);
  matvec(pool_, m.up, xn_.data(), up_.data(), faults_, m.up_b);
  const bool gelu = c.ffn_activation == FfnActivation::GeluTanh;
  const bool oai = c.is_moe() && c.moe.activation == ExpertActivation::SwiGLUOai;
  for (int64_t i = 0; i < n_ff; ++i) {
    const double g = gate_[size_t(i)], u = up_[size_t(i)];
    const double y = oai ? ops::swiglu_oai(g, u) : (gelu ? ops::gelu_tanh(g) : ops::silu(g)) * u;
    gate_[size_t(i)] = static_cast<float>(y);
  }
  matvec(pool_, m.down, gate_.data(), out, faults_, m.down_b);
}

// FFN of layer l (gated, or a mixture of gated experts): reads x_, adds the block's
// output to x_ (and leaves it in xn_ for the taps).
void ReferenceTransformer::feed_forward(int32_t l) {
  const ModelConfig& c = w_.config;
  const StoredLayerWeights& L = w_.layers[size_t(l)];
  const int64_t d = c.n_embd;
  const double eps = c.rms_norm_eps * faults_.rms_eps_scale;
  ops::rms_norm(x_.data(), L.ffn_norm.data(), xn_.data(), d, eps);
  if (c.is_moe()) {
    moe_feed_forward(l);
  } else {
    // The down projection reads gate_ only, so it may overwrite its input xn_.
    gated_ffn({L.w_gate, L.w_up, L.w_down}, c.n_ff, xn_.data());
  }
  if (c.post_norms) ops::rms_norm(xn_.data(), L.post_ffn_norm.data(), xn_.data(), d, eps);
  add_into(x_, xn_, d);
}

// Mixture-of-experts FFN of layer l on the normed input in xn_; the output replaces it.
// HF MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: router_logits = gate(h); softmax;
// topk; (renormalise); out = sum over the selected experts of weight * expert(h), each
// expert an MLP down(act(gate(h)) * up(h)). HF GptOssMLP: router_logits = linear(h, W, b);
// topk; softmax over the k; out = sum of weight * (down(swiglu_oai(gate(h) + bg, up(h) +
// bu)) + bd). llama.cpp build_moe_ffn computes the same (ggml_mul_mat_id per expert, the
// biases added per expert with ggml_add_id, weights multiplied in, summed over
// n_expert_used). Here the k outputs are summed in selection order in fp64, rounded once.
// HF Qwen2MoeSparseMoeBlock adds a shared expert: out += sigmoid(shared_expert_gate(h)) *
// shared_expert(h), shared_expert an MLP of width shared_expert_intermediate_size
// (llama.cpp src/models/qwen2moe.cpp: ffn_*_shexp, gated by ffn_gate_inp_shexp). Here its
// gate logit is an fp64 dot rounded to fp32 (as every matvec output), the sigmoid fp64,
// and sigmoid * output is added to the fp64 sum after the routed experts, before the
// one rounding.
void ReferenceTransformer::moe_feed_forward(int32_t l) {
  const ModelConfig& c = w_.config;
  const StoredLayerWeights& L = w_.layers[size_t(l)];
  const int64_t d = c.n_embd, ff = c.moe.n_ff_exp;
  const bool bias = c.moe.biases;
  matvec(pool_, L.ffn_gate_inp, xn_.data(), router_.data(), faults_,
         bias ? L.gate_inp_b.data() : nullptr);
  const std::vector<ops::ExpertWeight> chosen =
      faults_.moe_router() ? faulty_route(router_, c.moe, faults_)
      : c.moe.router == MoeRouter::TopKSoftmax
          ? ops::route_top_k_softmax(router_, c.moe.n_expert_used)
          : ops::route_softmax_top_k(router_, c.moe.n_expert_used, c.moe.norm_topk);
  std::fill(moe_sum_.begin(), moe_sum_.end(), 0.0);
  for (const ops::ExpertWeight& ew : chosen) {
    const int64_t e = ew.expert;  // rows [e * n_out, (e + 1) * n_out) of each 3-D tensor
    const ExpertMatrices m{L.gate_exps.slice(e * ff, ff),
                           L.up_exps.slice(e * ff, ff),
                           L.down_exps.slice(e * d, d),
                           bias ? L.gate_exps_b.data() + e * ff : nullptr,
                           bias ? L.up_exps_b.data() + e * ff : nullptr,
                           bias ? L.down_exps_b.data() + e * d : nullptr};
    gated_ffn(m, ff, expert_out_.data());
    for (int64_t i = 0; i < d; ++i)
      moe_sum_[size_t(i)] += ew.weight * double{expert_out_[size_t(i)]};
  }
  if (c.moe.n_ff_shexp > 0 && !faults_.moe_shared_expert_dropped) {
    const float g = static_cast<float>(ops::dot(L.gate_inp_shexp.data(), xn_.data(), d));
    const double sigma = 1.0 / (1.0 + std::exp(-double{g}));
    gated_ffn({L.gate_shexp, L.up_shexp, L.down_shexp}, c.moe.n_ff_shexp, expert_out_.data());
    for (int64_t i = 0; i < d; ++i) moe_sum_[size_t(i)] += sigma * double{expert_out_[size_t(i)]};
  }
  for (int64_t i = 0; i < d; ++i) xn_[size_t(i)] = static_cast<float>(moe_sum_[size_t(i)]);
}

}  // namespace touchstone
