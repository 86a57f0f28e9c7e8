// default_profiles.cpp - the tolerance profiles of goldens/manifest.json, for the
// manifests `touchstone golden --model PATH.gguf --cases ...` writes for a user's
// own model. GoldenTest.DefaultProfilesMatchTheProjectManifest keeps them equal.
#include "touchstone/golden/manifest.h"

namespace touchstone {

std::string default_profiles_json() {
  return R"json({
  "exact": {
    "description": "Full-precision paths (fp32 weights, fp32 or better accumulation): greedy identical to the reference except accepted near-ties; logits within accumulation-order noise. Thresholds and measurements: docs/metrics.md#tolerance-profiles.",
    "greedy": "identical",
    "near_tie_margin": 0.02,
    "near_tie_top_k": 5,
    "logits_nmse_max": 1e-09,
    "logits_max_abs_max": 0.002,
    "kld_mean_max": 1e-08,
    "kld_p99_max": 1e-07,
    "top1_agreement_min": 0.999,
    "ppl_ratio_max": 1.0001
  },
  "quantized": {
    "description": "4/8-bit weight paths that keep the GGUF blocks and compute with fp32 activations: 10x the exact profile, still tight enough to fail the deliberate faults. Thresholds and measurements: docs/metrics.md#tolerance-profiles.",
    "greedy": "tolerance",
    "near_tie_margin": 0.05,
    "near_tie_top_k": 5,
    "logits_nmse_max": 1e-08,
    "logits_max_abs_max": 0.005,
    "kld_mean_max": 1e-07,
    "kld_p99_max": 1e-06,
    "top1_agreement_min": 0.99,
    "ppl_ratio_max": 1.001
  },
  "quantized_int8": {
    "description": "Paths that also quantize activations to int8 per 32-block (llama.cpp style). Their own rounding error (KLD ~2.5e-3) exceeds what subtle faults add, so this profile catches only gross faults. Thresholds and measurements: docs/metrics.md#tolerance-profiles.",
    "greedy": "tolerance",
    "near_tie_margin": 0.5,
    "near_tie_top_k": 5,
    "logits_nmse_max": 0.05,
    "logits_max_abs_max": 3.0,
    "kld_mean_max": 0.01,
    "kld_p99_max": 0.03,
    "top1_agreement_min": 0.9,
    "ppl_ratio_max": 1.01
  }
})json";
}

}  // namespace touchstone
