// graph_moe.cpp - the mixture-of-experts FFN of the step graph (graph.h, ModelDims:
// Mixtral-style, Qwen3-MoE, Qwen2-MoE's shared expert, gpt-oss): the router in the graph,
// every expert on every token, the picks summed in the router's order. The formulas are
// reference_ffn.cpp's (moe_feed_forward).
#include <utility>
#include <vector>

#include "graph_build.h"

namespace touchstone::static_graph::graph_build {
namespace {

// gpt-oss's clamped SwiGLU (ops::swiglu_oai): (clamp(u, -7, 7) + 1) * g' *
// sigmoid(1.702 g'), g' = min(g, 7).
Val swiglu_oai(Emitter& le, const Val& g, const Val& u) {
  const Shape one(g.shape.size(), 1);
  auto k = [&](double v) { return le.splat(one, "f32", fmt_float(v)); };
  const Val gc = le.binary("tosa.minimum", g, k(7.0));
  const Val uc = le.binary("tosa.maximum", le.binary("tosa.minimum", u, k(7.0)), k(-7.0));
  const Val glu = le.mul(gc, le.unary("tosa.sigmoid", le.mul(gc, k(1.702))));
  return le.mul(le.add(uc, k(1.0)), glu);
}

// The router of a mixture-of-experts layer on x [T, d]: the selected experts, best
// first, as [T, 1] i32 each, and their weights [T, 1] (ModelDims: softmax over every
// expert, top k, renormalised over the k when norm_topk).
std::pair<std::vector<Val>, std::vector<Val>> route(Emitter& le, const Ctx& C, const LayerParams& p,
                                                    const Val& x) {
  const int64_t E = C.M.n_expert;
  Val logits = linear(le, C, x, p.mats[kFfnGateInp]);  // [T, E]
  if (C.M.moe_biases) logits = le.add(logits, p.vec.at("ffn_gate_inp.bias"));
  Val ex = le.unary("tosa.exp", le.sub(logits, le.reduce("tosa.reduce_max", logits, 1)));
  std::vector<int64_t> iota(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) iota[size_t(e)] = e;
  const Val ids = le.const_i32({1, E}, iota);
  const Val taken = le.splat({1, 1}, "f32", "-3.0e+38"), zero = le.splat({1, 1}, "f32", "0.0");
  std::vector<Val> experts, weights;
  Val left = logits, sum;
  const int32_t k = C.M.n_expert_used;
  const bool runner_up = C.F.moe_runner_up && k < E;       // the fault: pick k + 1 for pick k
  for (int32_t r = 0; r < k + (runner_up ? 1 : 0); ++r) {  // the largest logit left
    const Val idx = le.argmax1(left);
    const Val hit = le.equal(ids, idx);  // [T, E]
    left = le.select(hit, taken, left);
    if (runner_up && r == k - 1) continue;
    experts.push_back(idx);
    weights.push_back(le.reduce("tosa.reduce_sum", le.select(hit, ex, zero), 1));
    sum = weights.size() == 1 ? weights.back() : le.add(sum, weights.back());
  }
  const bool renormalise = C.F.moe_renormalise >= 0 ? C.F.moe_renormalise == 1 : C.M.norm_topk;
  if (!renormalise) sum = le.reduce("tosa.reduce_sum", ex, 1);
  const Val inv = le.unary("tosa.reciprocal", sum);
  for (Val& w : weights) w = le.mul(w, inv);
  return {experts, weights};
}

}  // namespace

// Mixture-of-experts FFN of x [T, d]: every expert runs on every token (the dense
// formulation of a static graph: one batched matmul per expert matrix, [E, T, d]), and
// each token sums its selected experts' outputs, weighted, in selection order; plus the
// shared expert scaled by sigmoid(ffn_gate_inp_shexp . x) when the model has one.
Val moe_ffn(Emitter& le, const Ctx& C, const LayerParams& p, const Val& x) {
  const int64_t T = C.T, E = C.M.n_expert, d = C.d;
  auto [experts, weights] = route(le, C, p, x);
  const int64_t ff = C.M.n_ff_exp;
  // + the expert's bias [E, 1, n] (gpt-oss).
  auto bias = [&](const Val& y, const char* name, int64_t n) {
    return C.M.moe_biases ? le.add(y, le.reshape(p.vec.at(name), {E, 1, n})) : y;
  };
  const Val xe = le.tile0(le.reshape(x, {1, T, d}), E);  // [E, T, d]
  const Val g = bias(le.matmul(xe, p.mats[kFfnGate][0]), "ffn_gate_exps.bias", ff);
  const Val u = bias(le.matmul(xe, p.mats[kFfnUp][0]), "ffn_up_exps.bias", ff);
  const Val gu = C.M.swiglu_oai ? swiglu_oai(le, g, u) : le.mul(activation(le, C, g), u);
  const Val y = le.transpose(bias(le.matmul(gu, p.mats[kFfnDown][0]), "ffn_down_exps.bias", d),
                             {1, 0, 2});  // [T, E, d]
  Val out;
  for (size_t r = 0; r < experts.size(); ++r) {
    const Val yr = le.mul(le.reshape(le.gather(y, experts[r]), {T, d}), weights[r]);
    out = r == 0 ? yr : le.add(out, yr);
  }
  if (C.M.n_ff_shexp > 0 && !C.F.moe_shared_expert_dropped) {
    const Val gl = le.reduce("tosa.reduce_sum", le.mul(x, p.vec.at("ffn_gate_inp_shexp")), 1);
    const Val s = gated_ffn(le, C, x, p.mats + kFfnGateShexp);
    out = le.add(out, le.mul(s, le.unary("tosa.sigmoid", gl)));
  }
  return out;
}

}  // namespace touchstone::static_graph::graph_build
