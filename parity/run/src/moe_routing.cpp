// moe_routing.cpp - the routing of a backend's mixture-of-experts FFN read back from
// its layer taps (touchstone/run/moe_routing.h has the maths).
#include "touchstone/run/moe_routing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "touchstone/abi/backend_abi.h"
#include "touchstone/common/error.h"
#include "touchstone/metrics/metrics.h"
#include "touchstone/model/moe_router.h"
#include "touchstone/model/scalar_ops.h"

namespace touchstone {
namespace {

constexpr int kExtraCandidates = 4;     // experts beyond k the backend's router ranks first
constexpr double kExplainFactor = 0.1;  // a candidate explains it at 1/10 the reference's NMSE

struct LayerView {
  const StoredWeights& w;
  int layer;
  int64_t d, ff;
  const StoredLayerWeights& L() const { return w.layers[size_t(layer)]; }
};

// The FFN's input stream of one step's taps (see the header).
std::vector<float> ffn_input(const LayerView& v, std::span<const float> taps) {
  const size_t D = size_t(v.d), rec = size_t(TS_TAP_POINTS) * D;
  const float* cur = taps.data() + size_t(v.layer) * rec;
  std::vector<float> x(D);
  for (size_t i = 0; i < D; ++i) {
    if (v.layer > 0) {
      const float* prev = cur - rec;
      x[i] = float(double{prev[TS_TAP_RESIDUAL * D + i]} + double{cur[TS_TAP_ATTN_OUT * D + i]});
    } else {
      x[i] = cur[TS_TAP_RESIDUAL * D + i] - cur[TS_TAP_FFN_OUT * D + i];
    }
  }
  return x;
}

// y = W x (+ b): fp64 dot, the bias added before the one rounding (as the reference).
// W as stored, each row dequantized as the reference dequantizes it.
std::vector<float> matvec(const WeightMatrix& W, std::span<const float> x,
                          const float* b = nullptr) {
  std::vector<float> y(static_cast<size_t>(W.rows())), row(x.size());
  for (int64_t o = 0; o < W.rows(); ++o) {
    const double acc = ops::dot(W.row(o, row.data()), x.data(), int64_t(x.size()));
    y[size_t(o)] = float(b ? acc + double{b[o]} : acc);
  }
  return y;
}

// down(act(gate h + bg) * (up h + bu)) + bd, rounded as the reference rounds (biases
// null unless gpt-oss, whose act is its clamped SwiGLU).
std::vector<float> gated_mlp(const LayerView& v, const WeightMatrix& gate, const WeightMatrix& up,
                             const WeightMatrix& down, std::span<const float> h,
                             const float* bg = nullptr, const float* bu = nullptr,
                             const float* bd = nullptr) {
  std::vector<float> g = matvec(gate, h, bg);
  const std::vector<float> u = matvec(up, h, bu);
  const bool gelu = v.w.config.ffn_activation == FfnActivation::GeluTanh;
  const bool oai = v.w.config.moe.activation == ExpertActivation::SwiGLUOai;
  for (size_t i = 0; i < g.size(); ++i) {
    const double y = oai ? ops::swiglu_oai(g[i], u[i])
                         : (gelu ? ops::gelu_tanh(g[i]) : ops::silu(g[i])) * double{u[i]};
    g[i] = float(y);
  }
  return matvec(down, g, bd);
}

// Expert e's gated MLP on the normed input h (gpt-oss: with its biases).
std::vector<float> expert_output(const LayerView& v, int32_t e, std::span<const float> h) {
  const StoredLayerWeights& L = v.L();
  const bool bias = v.w.config.moe.biases;
  return gated_mlp(v, L.gate_exps.slice(e * v.ff, v.ff), L.up_exps.slice(e * v.ff, v.ff),
                   L.down_exps.slice(e * v.d, v.d), h,
                   bias ? L.gate_exps_b.data() + e * v.ff : nullptr,
                   bias ? L.up_exps_b.data() + e * v.ff : nullptr,
                   bias ? L.down_exps_b.data() + e * v.d : nullptr);
}

// The shared expert's term sigmoid(fp32(w_shexp . h)) * S(h) (qwen2moe; the reference's
// roundings), empty for a family without one.
std::vector<double> shared_term(const LayerView& v, std::span<const float> h) {
  const StoredLayerWeights& L = v.L();
  if (v.w.config.moe.n_ff_shexp <= 0) return {};
  const float z = float(ops::dot(L.gate_inp_shexp.data(), h.data(), v.d));
  const double sigma = 1.0 / (1.0 + std::exp(-double{z}));
  const std::vector<float> s = gated_mlp(v, L.gate_shexp, L.up_shexp, L.down_shexp, h);
  std::vector<double> t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = sigma * double{s[i]};
  return t;
}

struct Router {
  std::vector<float> h, z;     // normed input, router logits
  std::vector<double> p;       // softmax(z)
  std::vector<int32_t> order;  // every expert, largest p first (ties: lower index)
};

Router route(const LayerView& v, std::span<const float> x) {
  Router r;
  r.h.resize(x.size());
  ops::rms_norm(x.data(), v.L().ffn_norm.data(), r.h.data(), v.d, v.w.config.rms_norm_eps);
  r.z = matvec(v.L().ffn_gate_inp, r.h, v.w.config.moe.biases ? v.L().gate_inp_b.data() : nullptr);
  r.p = ops::softmax(r.z);
  r.order = ops::top_k_experts(r.p, v.w.config.moe.n_expert);
  return r;
}

// sum_{e in set} w_e E_e (+ the shared term) in fp64, rounded once (the reference's
// order: the set's, then the shared expert).
RoutingCandidate mix(const std::map<int32_t, std::vector<float>>& E, const Router& r,
                     std::vector<int32_t> set, bool renormalise, std::span<const double> shared,
                     std::span<const float> f_test) {
  double sum_p = 0;
  for (int32_t e : set) sum_p += r.p[size_t(e)];
  std::vector<double> acc(f_test.size(), 0.0);
  for (int32_t e : set) {
    const double w = renormalise ? r.p[size_t(e)] / sum_p : r.p[size_t(e)];
    const std::vector<float>& out = E.at(e);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += w * double{out[i]};
  }
  for (size_t i = 0; i < shared.size(); ++i) acc[i] += shared[i];
  std::vector<float> y(acc.begin(), acc.end());
  return {std::move(set), renormalise, !shared.empty(), metrics::nmse(f_test, y)};
}

std::string list(const std::vector<int32_t>& v) {
  std::vector<int32_t> s(v);
  std::sort(s.begin(), s.end());
  return fmt::format("{{{}}}", fmt::join(s, ", "));
}

bool same_set(std::vector<int32_t> a, std::vector<int32_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

}  // namespace

bool RoutingDiagnosis::routing_differs() const {
  return !same_set(best.experts, reference) && best.nmse <= kExplainFactor * reference_mix.nmse;
}

bool RoutingDiagnosis::weighting_differs() const {
  return same_set(best.experts, reference) && best.renormalised != family_renormalises &&
         best.shared == family_has_shared && best.nmse <= kExplainFactor * reference_mix.nmse;
}

bool RoutingDiagnosis::shared_differs() const {
  return same_set(best.experts, reference) && best.shared != family_has_shared &&
         best.nmse <= kExplainFactor * reference_mix.nmse;
}

bool RoutingDiagnosis::near_tie(double near_tie_margin) const {
  if (!routing_differs() || runner_up < 0 || reference.empty()) return false;
  std::vector<int32_t> swapped(reference);
  swapped.back() = runner_up;
  return same_set(best.experts, swapped) && margin < near_tie_margin;
}

std::string RoutingDiagnosis::describe(double near_tie_margin) const {
  const std::string where = fmt::format("step {}, layer {}", step, layer);
  const std::string ref = fmt::format(
      "the reference's experts {} (router margin {:.4g} nats between its k-th and "
      "expert {}, the runner-up)",
      list(reference), margin, runner_up);
  if (routing_differs()) {
    return fmt::format(
        "routing divergence at {}: the backend's FFN output is the mixture of experts {} "
        "(NMSE {:.3e}), not {} (NMSE {:.3e} on the backend's own FFN input); {}{}",
        where, list(best.experts), best.nmse, list(reference), reference_mix.nmse, ref,
        near_tie(near_tie_margin)
            ? fmt::format(": a near tie (< {} nats), accepted", near_tie_margin)
            : fmt::format(": not a near tie (the rule: the runner-up swapped in, margin < {} "
                          "nats)",
                          near_tie_margin));
  }
  if (shared_differs()) {
    return fmt::format(
        "shared expert missing at {}: the backend's FFN output is the routed experts {} "
        "without the shared expert's term (NMSE {:.3e}), the family adds it (NMSE {:.3e})",
        where, list(best.experts), best.nmse, reference_mix.nmse);
  }
  if (weighting_differs()) {
    return fmt::format(
        "expert weighting differs at {}: the backend's FFN output is {} {} (NMSE {:.3e}), the "
        "family {} (NMSE {:.3e})",
        where, list(best.experts), best.renormalised ? "renormalised" : "not renormalised",
        best.nmse, family_renormalises ? "renormalises" : "does not renormalise",
        reference_mix.nmse);
  }
  return fmt::format(
      "routing agrees at {} ({}); the backend's FFN output is NMSE {:.3e} from that mixture on "
      "its own FFN input: the experts' arithmetic differs, not the routing",
      where, ref, reference_mix.nmse);
}

std::optional<RoutingDiagnosis> diagnose_routing(const StoredWeights& w, int step, int layer,
                                                 std::span<const float> ref_taps,
                                                 std::span<const float> test_taps) {
  const ModelConfig& c = w.config;
  if (!c.is_moe() || layer < 0 || layer >= c.n_layer) return std::nullopt;
  const size_t rec = size_t(c.n_layer) * TS_TAP_POINTS * size_t(c.n_embd);
  if (ref_taps.size() != rec || test_taps.size() != rec) {
    throw Error("routing diagnosis: tap records of {} and {} floats, the model's is {}",
                ref_taps.size(), test_taps.size(), rec);
  }
  const LayerView v{w, layer, c.n_embd, c.moe.n_ff_exp};
  const int k = c.moe.n_expert_used, n = c.moe.n_expert;
  const Router ref = route(v, ffn_input(v, ref_taps));
  const Router test = route(v, ffn_input(v, test_taps));
  const size_t D = size_t(c.n_embd);
  const std::span<const float> f_test =
      test_taps.subspan((size_t(layer) * TS_TAP_POINTS + TS_TAP_FFN_OUT) * D, D);
  RoutingDiagnosis dg;
  dg.step = step;
  dg.layer = layer;
  dg.reference.assign(ref.order.begin(), ref.order.begin() + k);
  // gpt-oss's softmax over its top k is the renormalised softmax (up to rounding).
  dg.family_renormalises = c.moe.norm_topk || c.moe.router == MoeRouter::TopKSoftmax;
  dg.family_has_shared = c.moe.n_ff_shexp > 0;
  const std::vector<double> shared = shared_term(v, test.h);
  if (k < n) {
    dg.runner_up = ref.order[size_t(k)];
    dg.margin = double{ref.z[size_t(ref.order[size_t(k - 1)])]} - ref.z[size_t(dg.runner_up)];
  }
  std::vector<int32_t> pool(test.order.begin(),
                            test.order.begin() + std::min(n, k + kExtraCandidates));
  std::map<int32_t, std::vector<float>> E;
  for (int32_t e : dg.reference) E.emplace(e, expert_output(v, e, test.h));
  for (int32_t e : pool) E.try_emplace(e, expert_output(v, e, test.h));
  dg.reference_mix = mix(E, test, dg.reference, dg.family_renormalises, shared, f_test);
  dg.best = dg.reference_mix;
  auto consider = [&](const std::vector<int32_t>& set) {
    for (bool renorm : {dg.family_renormalises, !dg.family_renormalises}) {
      for (bool with_shared : {true, false}) {
        if (!with_shared && shared.empty()) continue;
        RoutingCandidate cand =
            mix(E, test, set, renorm,
                with_shared ? std::span<const double>(shared) : std::span<const double>(), f_test);
        if (cand.nmse < dg.best.nmse) dg.best = std::move(cand);
      }
    }
  };
  consider(dg.reference);
  for (size_t i = 0; i < dg.reference.size(); ++i) {
    for (const auto& [e, out] : E) {
      if (std::find(dg.reference.begin(), dg.reference.end(), e) != dg.reference.end()) continue;
      std::vector<int32_t> set(dg.reference);
      set[i] = e;
      consider(set);
    }
  }
  return dg;
}

}  // namespace touchstone
