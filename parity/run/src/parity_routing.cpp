// parity_routing.cpp - a parity run's diagnosis of a mixture-of-experts FFN divergence:
// when a case's first divergent layer tap is an FFN output of a mixture-of-experts
// model, which experts the backend used (touchstone/run/moe_routing.h), judged by the
// near-tie rule of docs/metrics.md ("Routing divergence").
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "parity_internal.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/run/model_facts.h"
#include "touchstone/run/moe_routing.h"

namespace touchstone {

namespace {

// The model's weights (as stored, as the reference loads them), read once per run
// and only for a mixture-of-experts model (the config from model_facts, read once per
// process); null for a dense model.
const StoredWeights* moe_weights(const Inputs& in) {
  if (!in.moe_probe) {
    in.moe_probe = std::make_shared<MoeProbe>();
    const std::optional<ModelConfig>& c = model_facts(in.model_path).config;
    if (c && c->is_moe()) in.moe_probe->weights = load_stored_weights(in.model_path);
  }
  return in.moe_probe->weights ? &*in.moe_probe->weights : nullptr;
}

}  // namespace

namespace {

struct RoutingScan {
  int pairs = 0, agreed = 0, ties = 0;
  std::optional<RoutingDiagnosis> first_wrong, first_tie;
};

// Every compared tap step x mixture-of-experts layer, in order; layer divergence ld
// (an FFN output) gets its pair's description.
RoutingScan scan(const StoredWeights& w, const GoldenCase& g, const CaseResult& r, double tie,
                 LayerDivergence* ld) {
  RoutingScan sc;
  const size_t rec = g.tap_record_size();
  const std::span<const float> ref(g.taps), test(r.backend_taps);
  for (int t = 0; t < r.tap_steps_compared; ++t) {
    for (int l = 0; l < w.config.n_layer; ++l) {
      const int step = g.tap_steps[size_t(t)];
      const std::optional<RoutingDiagnosis> dg = diagnose_routing(
          w, step, l, ref.subspan(size_t(t) * rec, rec), test.subspan(size_t(t) * rec, rec));
      if (!dg) continue;
      ++sc.pairs;
      if (ld && ld->step == step && ld->layer == l) ld->explanation = dg->describe(tie);
      if (!dg->routing_differs() && !dg->weighting_differs() && !dg->shared_differs()) {
        ++sc.agreed;
      } else if (dg->near_tie(tie)) {
        ++sc.ties;
        if (!sc.first_tie) sc.first_tie = dg;
      } else if (!sc.first_wrong) {
        sc.first_wrong = dg;
      }
    }
  }
  return sc;
}

}  // namespace

void explain_routing(const Inputs& in, const GoldenCase& g, CaseResult& r) {
  const size_t rec = g.tap_record_size();
  if (r.tap_steps_compared == 0 || rec == 0 || in.model_path.empty() ||
      r.backend_taps.size() != size_t(r.tap_steps_compared) * rec ||
      g.taps.size() < r.backend_taps.size()) {
    return;
  }
  const StoredWeights* w = moe_weights(in);
  if (!w) return;
  LayerDivergence* ld =
      r.first_layer_divergence && r.first_layer_divergence->point == TS_TAP_FFN_OUT
          ? &*r.first_layer_divergence
          : nullptr;
  const double tie = in.profile->near_tie_margin;
  const RoutingScan sc = scan(*w, g, r, tie, ld);
  r.routing = fmt::format(
      "routing as the reference's at {} of {} (step, layer) pairs, {} near-tie swap{} accepted",
      sc.agreed, sc.pairs, sc.ties, sc.ties == 1 ? "" : "s");
  if (sc.first_tie) r.routing += " (first: " + sc.first_tie->describe(tie) + ")";
  if (sc.first_wrong) {
    const RoutingDiagnosis& dg = *sc.first_wrong;
    r.failures.push_back(dg.describe(tie));
    r.violations.push_back({dg.routing_differs()  ? "routing"
                            : dg.shared_differs() ? "shared_expert"
                                                  : "expert_weighting",
                            double(dg.step), double(dg.layer)});
    r.passed = false;
  } else if (ld && !ld->explanation.empty() && !r.failures.empty()) {
    r.failures.push_back(ld->explanation);
  }
}

}  // namespace touchstone
