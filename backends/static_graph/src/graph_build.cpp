// graph_build.cpp - building blocks of the step graph that more than one part of the
// builder uses (graph_build.h): the weight matmul, the gated FFN and its activations.
#include "graph_build.h"

namespace touchstone::static_graph::graph_build {

// y [T, out] = x [T, in] . M, M given as its input-dim slices [1, c_k, out] (one
// normally; the thread_order_reduction fault: partial products summed in fp32
// in slice order). fp16_accumulation fault: y rounded through f16.
Val linear(Emitter& em, const Ctx& C, const Val& x, const std::vector<Val>& m) {
  Val y;
  int64_t c0 = 0;
  for (const Val& w : m) {
    const int64_t c = w.shape[1];
    const Val xs = m.size() == 1 ? x : em.slice(x, {0, c0}, {C.T, c});
    const Val part = em.matmul(em.reshape(xs, {1, C.T, c}), w);
    y = c0 == 0 ? part : em.add(y, part);
    c0 += c;
  }
  y = em.reshape(y, {C.T, m[0].shape[2]});
  if (C.F.fp16_accumulation) y = em.cast(em.cast(y, "f16"), "f32");
  return y;
}

// tanh-GELU (HF gelu_pytorch_tanh): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
Val gelu_tanh(Emitter& le, const Val& g) {
  auto k = [&](double v) { return le.splat({1, 1}, "f32", fmt_float(v)); };
  Val inner = le.add(g, le.mul(le.mul(le.mul(g, g), g), k(0.044715)));
  Val t = le.unary("tosa.tanh", le.mul(inner, k(0.79788456080286535587989211986876)));
  return le.mul(le.mul(g, k(0.5)), le.add(t, k(1.0)));
}

// The gate's activation: SiLU (SwiGLU) or tanh-GELU (GeGLU).
Val activation(Emitter& le, const Ctx& C, const Val& g) {
  return C.M.geglu ? gelu_tanh(le, g) : le.mul(g, le.unary("tosa.sigmoid", g));
}

// down(act(x . gate) * (x . up)) of x [T, d], act SiLU (SwiGLU) or tanh-GELU (GeGLU);
// m: the gate, up and down matrices' operands.
Val gated_ffn(Emitter& le, const Ctx& C, const Val& x, const std::vector<Val>* m) {
  Val g = linear(le, C, x, m[0]);
  Val u = linear(le, C, x, m[1]);
  return linear(le, C, le.mul(activation(le, C, g), u), m[2]);
}

}  // namespace touchstone::static_graph::graph_build
