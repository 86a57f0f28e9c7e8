// vk_moe.cpp - the mixture-of-experts FFN of a pass (Mixtral-style: llama +
// llama.expert_count; Qwen3-MoE; Qwen2-MoE with its shared expert; gpt-oss with its
// router bias, top-k-then-softmax router, expert biases and clamped SwiGLU: see
// route_rows, record_expert_biases and docs/backends/vulkan.md, "gpt-oss"), the
// reference's maths
// (reference/transformer/src/reference_ffn.cpp, moe_feed_forward), per row:
//   r = W_router h                                       device, fp32 (the matmul shaders)
//   (e_j, w_j), j < k = ops::route_softmax_top_k(r, k, norm_topk)
//       on the host, the reference's own function (touchstone/model/moe_router.h:
//       fp64 softmax, the k largest, equal: lower expert index first, renormalised
//       unless norm_topk is false; HF MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock;
//       llama.cpp llm_graph_context::build_moe_ffn)
//   o_j = Wdown_e_j (SiLU(Wgate_e_j h) * (Wup_e_j h))    the dense FFN's shaders on
//       expert e_j's rows of the 3-D tensors (vk_weights.h: DeviceExperts)
//   f = ((0 + w_0 o_0) + w_1 o_1) + ...                  moe_sum.comp: fp32 in the router's
//       order, each product and sum rounded (the reference: the same order in fp64,
//       rounded once)
// The router logits (rows x n_expert floats) come back to the host mid-pass: the
// commands recorded so far are submitted (flush) and the pass continues in a new
// command buffer. The rows' slots (row i's j-th choice) are grouped by expert in
// row order (a counting sort, as cpu_simd's engine_moe.cpp), moe_gather.comp copies
// the normed rows into that order, and each expert chosen by any row runs its gate
// / up matmuls, SwiGLU and down matmul once over its grouped rows. Every matmul
// output is summed in an order fixed by its own row of W (the same for any token
// count or tile, docs/backends/vulkan.md#serving) and the routing and the weighted
// sum are per row, so a row's result does not depend on the other rows of the pass
// (batch invariance holds as for dense models). A shared expert (qwen2moe) runs as a
// dense FFN over every row into moe_shared; its gate logit comes back with the router's
// and moe_sum.comp adds sigmoid(logit) times its output after the routed experts.
#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <vector>

#include "touchstone/model/moe_router.h"
#include "touchstone/model/scalar_ops.h"
#include "vk_forward.h"
#include "vk_matmul.h"

namespace touchstone::vk {
namespace {

uint32_t groups(uint32_t n) { return (n + kWorkgroup - 1) / kWorkgroup; }

// The router under a mixture-of-experts fault (touchstone/model/faults.h), injected
// as the reference does (reference_ffn.cpp, faulty_route): p = softmax of every
// expert's logit, the top k of p (equal: lower index); moe_runner_up takes the
// (k+1)-th in place of the k-th; the weights p_e / sum_S p when the family
// renormalises, or p_e as the softmax gave them with moe_renorm_skipped.
std::vector<ops::ExpertWeight> route_with_fault(std::span<const float> logits, int32_t k,
                                                bool norm_topk, const Faults& f) {
  const std::vector<double> p = ops::softmax(logits);
  const int32_t ne = int32_t(logits.size());
  std::vector<int32_t> top = ops::top_k_experts(p, std::min(k + 1, ne));
  if (f.moe_runner_up && k < ne) top[size_t(k - 1)] = top[size_t(k)];
  top.resize(size_t(k));
  double sum = 0.0;
  for (int32_t e : top) sum += p[size_t(e)];
  const bool renormalise = norm_topk && !f.moe_renorm_skipped;
  std::vector<ops::ExpertWeight> out;
  for (int32_t e : top) out.push_back({e, renormalise ? p[size_t(e)] / sum : p[size_t(e)]});
  return out;
}

}  // namespace

void Forward::flush(Recorder& r) {
  r.host_barrier();
  ctx_.submit_and_wait(r.handle());
  if (prof_) prof_->collect();
  const VkCommandBuffer cb = ctx_.begin();
  if (prof_) prof_->begin(cb);
  r.restart(cb);
}

std::vector<uint32_t> Forward::route_rows(const Activations& a, uint32_t n,
                                          const std::vector<float>& router_b) const {
  const ModelConfig& c = w_.config;
  const size_t ne = size_t(c.moe.n_expert), k = size_t(c.moe.n_expert_used);
  const size_t S = size_t(a.rows) * k;  // route's section length
  const float* logits = static_cast<const float*>(a.router.mapped());
  uint32_t* route = static_cast<uint32_t*>(a.route.mapped());
  std::vector<uint32_t> expert(size_t(n) * k), first(ne + 1, 0);
  const bool topk_softmax = c.moe.router == MoeRouter::TopKSoftmax;
  std::vector<float> biased(ne);
  for (size_t i = 0; i < n; ++i) {
    std::span<const float> r(logits + i * ne, ne);
    if (!router_b.empty()) {  // gpt-oss: the router bias, added in fp32 to the rounded logits
      for (size_t e = 0; e < ne; ++e) biased[e] = r[e] + router_b[e];
      r = biased;
    }
    const std::vector<ops::ExpertWeight> chosen =
        faults_.moe()  ? route_with_fault(r, int32_t(k), c.moe.norm_topk || topk_softmax, faults_)
        : topk_softmax ? ops::route_top_k_softmax(r, int32_t(k))
                       : ops::route_softmax_top_k(r, int32_t(k), c.moe.norm_topk);
    for (size_t j = 0; j < k; ++j) {
      expert[i * k + j] = uint32_t(chosen[j].expert);
      route[2 * S + i * k + j] = std::bit_cast<uint32_t>(static_cast<float>(chosen[j].weight));
      ++first[size_t(chosen[j].expert) + 1];
    }
  }
  for (size_t e = 0; e < ne; ++e) first[e + 1] += first[e];
  std::vector<uint32_t> next(first.begin(), first.end() - 1);
  for (size_t s = 0; s < expert.size(); ++s) {  // slots in row order: rows stay in order
    const uint32_t g = next[expert[s]]++;
    route[g] = uint32_t(s / k);  // grouped row g reads row s / k
    route[S + s] = g;            // slot s's output is grouped row g
  }
  return first;
}

void Forward::record_moe(Recorder& r, const Pass& p, size_t l) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  Activations& a = p.act;
  const uint32_t d = uint32_t(c.n_embd), ne = uint32_t(c.moe.n_expert), n = p.n;
  const uint32_t k = uint32_t(c.moe.n_expert_used), fe = uint32_t(c.moe.n_ff_exp);
  const uint32_t S = a.rows * k, slots = n * k;
  record_matmul(r, k_, L.router, a.xn, a.router, MatmulPush{d, ne, n, 0, d, 0, ne, 0});
  const bool shared = c.moe.n_ff_shexp > 0;
  if (shared)
    record_matmul(r, k_, L.shexp_gate_inp, a.xn, a.shexp_logit, MatmulPush{d, 1, n, 0, d, 0, 1, 0});
  flush(r);  // the router (and shared-expert gate) logits to the host
  const std::vector<uint32_t> first = route_rows(a, n, L.router_b);
  if (shared) shared_sigmas(a, n);
  r.dispatch(k_.moe_gather(), {&a.xn, &a.route, &a.moe_x}, MoeGatherPush{d, slots, 0}, groups(d),
             slots);
  r.barrier();
  for (uint32_t e = 0; e < ne; ++e) {  // no barrier between experts: disjoint rows
    const uint32_t g0 = first[e], m = first[e + 1] - g0;
    if (m == 0) continue;
    record_matmul(r, k_, L.gate_exps, e, a.moe_x, a.gate,
                  MatmulPush{d, fe, m, g0 * d, d, g0 * fe, fe, 0});
    record_matmul(r, k_, L.up_exps, e, a.moe_x, a.up,
                  MatmulPush{d, fe, m, g0 * d, d, g0 * fe, fe, 0});
  }
  r.barrier();
  if (c.moe.biases) record_expert_biases(r, a, first, L.gate_exps_b, L.up_exps_b, fe);
  const bool oai = c.moe.activation == ExpertActivation::SwiGLUOai;
  r.dispatch(
      k_.glu(), {&a.gate, &a.up},
      GluPush{slots * fe, oai ? 2u : 0u, float(ops::kSwigluOaiAlpha), float(ops::kSwigluOaiLimit)},
      groups(slots * fe));  // SwiGLU, or gpt-oss's clamped one
  r.barrier();
  for (uint32_t e = 0; e < ne; ++e) {
    const uint32_t g0 = first[e], m = first[e + 1] - g0;
    if (m == 0) continue;
    record_matmul(r, k_, L.down_exps, e, a.gate, a.moe_out,
                  MatmulPush{fe, d, m, g0 * fe, fe, g0 * d, d, 0});
  }
  r.barrier();
  if (c.moe.biases) record_expert_biases(r, a, first, L.down_exps_b, Buffer(), d);
  if (shared) record_shared_expert(r, p, l);
  r.dispatch(k_.moe_sum(), {&a.moe_out, &a.route, &a.blk, shared ? &a.moe_shared : &a.moe_out},
             MoeSumPush{d, n, k, S, 2 * S, shared ? 1u : 0u, 3 * S}, groups(d), n);
  r.barrier();
}

// gpt-oss: expert e's bias rows added to its grouped rows [first[e], first[e + 1]) of
// a.gate (b0) and a.up (b1; empty: a.moe_out, the down projection's), n values a row.
void Forward::record_expert_biases(Recorder& r, Activations& a, const std::vector<uint32_t>& first,
                                   const Buffer& b0, const Buffer& b1, uint32_t n) {
  const uint32_t ne = uint32_t(first.size() - 1);
  for (uint32_t e = 0; e < ne; ++e) {
    const uint32_t g0 = first[e], m = first[e + 1] - g0;
    if (m == 0) continue;
    const BiasAddPush bp{n, m, g0 * n, e * n};
    if (b1.size() == 0) {
      r.dispatch(k_.bias_add(), {&a.moe_out, &b0}, bp, groups(n * m));
    } else {
      r.dispatch(k_.bias_add(), {&a.gate, &b0}, bp, groups(n * m));
      r.dispatch(k_.bias_add(), {&a.up, &b1}, bp, groups(n * m));
    }
  }
  r.barrier();
}

// sigma_t = 1 / (1 + exp(-z_t)) of each row's shared-expert gate logit z_t (fp32, as
// the matmul shaders round it), in fp64, stored as fp32 bits after route's 3 sections.
void Forward::shared_sigmas(const Activations& a, uint32_t n) const {
  const size_t S = size_t(a.rows) * size_t(w_.config.moe.n_expert_used);
  const float* z = static_cast<const float*>(a.shexp_logit.mapped());
  uint32_t* route = static_cast<uint32_t*>(a.route.mapped());
  for (uint32_t t = 0; t < n; ++t) {
    const double sigma = 1.0 / (1.0 + std::exp(-double{z[t]}));
    route[3 * S + t] = std::bit_cast<uint32_t>(static_cast<float>(sigma));
  }
}

// The shared expert (qwen2moe) over the pass's n normed rows, as the dense FFN: gate /
// up matmuls, SwiGLU, down matmul into moe_shared (the routed experts are done with
// gate and up by then).
void Forward::record_shared_expert(Recorder& r, const Pass& p, size_t l) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  Activations& a = p.act;
  const uint32_t d = uint32_t(c.n_embd), fs = uint32_t(c.moe.n_ff_shexp), n = p.n;
  record_gate_up_act(r, p, L.gate_shexp, L.up_shexp, fs, 0);  // SwiGLU
  record_matmul(r, k_, L.down_shexp, a.gate, a.moe_shared, MatmulPush{fs, d, n, 0, fs, 0, d, 0});
  r.barrier();
}

}  // namespace touchstone::vk
