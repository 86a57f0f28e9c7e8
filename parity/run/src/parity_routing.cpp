// parity_routing.cpp - a parity run's diagnosis of a mixture-of-experts FFN divergence:
// when a case's first divergent layer tap is an FFN output of a mixture-of-experts
// model, which experts the backend used (touchstone/run/moe_routing.h), judged by the
// near-tie rule of docs/metrics.md ("Routing divergence").
#include <algorithm>

#include "parity_internal.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/run/moe_routing.h"

namespace touchstone {

namespace {

// The model's weights (dequantized as the reference loads them), read once per run;
// null for a dense model.
const ModelWeights* moe_weights(const Inputs& in) {
  if (!in.moe_probe) {
    in.moe_probe = std::make_shared<MoeProbe>();
    const gguf::File f = gguf::File::open(in.model_path);
    if (read_model_config(f).is_moe()) in.moe_probe->weights = load_model_weights(f);
  }
  return in.moe_probe->weights ? &*in.moe_probe->weights : nullptr;
}

}  // namespace

void explain_routing(const Inputs& in, const GoldenCase& g, CaseResult& r) {
  if (!r.first_layer_divergence || r.first_layer_divergence->point != TS_TAP_FFN_OUT) return;
  LayerDivergence& ld = *r.first_layer_divergence;
  const auto t = std::find(g.tap_steps.begin(), g.tap_steps.end(), ld.step);
  if (ld.backend_taps.empty() || t == g.tap_steps.end() || in.model_path.empty()) return;
  const ModelWeights* w = moe_weights(in);
  if (!w) return;
  const size_t rec = g.tap_record_size();
  const std::span<const float> ref =
      std::span<const float>(g.taps).subspan(size_t(t - g.tap_steps.begin()) * rec, rec);
  const std::optional<RoutingDiagnosis> dg =
      diagnose_routing(*w, ld.step, ld.layer, ref, ld.backend_taps);
  if (!dg) return;
  const double tie = in.profile->near_tie_margin;
  ld.explanation = dg->describe(tie);
  const bool wrong = (dg->routing_differs() && !dg->near_tie(tie)) || dg->weighting_differs();
  if (wrong) {
    r.failures.push_back(ld.explanation);
    r.violations.push_back({dg->routing_differs() ? "routing" : "expert_weighting", dg->best.nmse,
                            dg->reference_mix.nmse});
    r.passed = false;
  } else if (!r.failures.empty()) {
    r.failures.push_back(ld.explanation);
  }
}

}  // namespace touchstone
