// touchstone/run/moe_routing.h - which experts a backend's mixture-of-experts FFN
// used, read back from its layer taps (no backend call beyond the taps it already
// returns). docs/metrics.md, "Routing divergence".
//
// At a tap step, layer l's taps are [TS_TAP_POINTS][n_embd] float32 (backend_abi.h):
// the attention output a_l, the FFN output f_l and the residual stream r_l after the
// layer. The FFN's input is the residual stream after attention,
//   x = r_{l-1} + a_l   (fp64 sum rounded once, as the reference adds; l >= 1)
//   x = r_0 - f_0       (layer 0, whose input stream, the embedding, is not tapped)
// From x (the golden's taps: the reference's own input; the backend's taps: its own),
// with the model's weights as the reference loads them:
//   h = RMSNorm(x) (ffn_norm), router logits z_e = W_gate_inp[e] . h (+ bias: gpt-oss;
//   fp64 dot, fp32), p = softmax(z), the reference's experts S = its top k of p
//   (moe_router.h; gpt-oss's top k of z is the same set),
//   its margin = z of its k-th expert minus z of the runner-up (the (k+1)-th), in nats;
//   each candidate expert's output E_e = down_e(act(gate_e h) * up_e h) (gpt-oss: with
//   the expert biases and its clamped SwiGLU) on the backend's h, and for an expert set
//   T the mixture sum_{e in T} w_e E_e with w_e = p_e / sum_T p (renormalised: also what
//   gpt-oss's softmax over its top k gives) or p_e (not), p from the backend's h.
// A family with a shared expert (qwen2moe) adds sigmoid(w_shexp . h) * S(h) to every
// mixture, S its gated FFN on the backend's h.
// Candidates: the reference's set, and every set with one of its experts replaced
// by one of the k + 4 experts the backend's own router input ranks first; each with
// and without renormalisation (and, with a shared expert, each also without it). The candidate
// nearest (NMSE) the backend's f_l is the backend's routing, when it is at least 10x nearer than
// the reference's own mixture on the same input (else the divergence is in the experts'
// arithmetic).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "touchstone/model/model_weights.h"

namespace touchstone {

struct RoutingCandidate {
  std::vector<int32_t> experts;  // in the reference's router order, swaps in place
  bool renormalised = true;
  bool shared = false;  // the shared expert's term included (families that have one)
  double nmse = 0.0;    // mixture on the backend's FFN input vs the backend's FFN output
};

struct RoutingDiagnosis {
  int step = 0, layer = 0;
  std::vector<int32_t> reference;  // the reference's experts, largest probability first
  int32_t runner_up = -1;          // the reference's (k+1)-th expert; -1 when k = n_expert
  double margin = 0.0;             // router logit of its k-th expert minus the runner-up's
  bool family_renormalises = true;
  bool family_has_shared = false;  // a shared expert (qwen2moe)
  RoutingCandidate reference_mix;  // the reference's set and weighting, on the backend's input
  RoutingCandidate best;           // the nearest candidate
  // The backend used another expert set (best explains it, 10x nearer than reference_mix).
  bool routing_differs() const;
  // The backend's weighting differs (the reference's set, renormalised where the family
  // does not renormalise, or the reverse).
  bool weighting_differs() const;
  // The backend left the shared expert out (the reference's set and weighting without it).
  bool shared_differs() const;
  // routing_differs() through the reference's k-th expert replaced by its runner-up,
  // with a margin below near_tie_margin (nats): accepted, as a greedy near-tie is.
  bool near_tie(double near_tie_margin) const;
  std::string describe(double near_tie_margin) const;
};

// The diagnosis of layer `layer` at tap step `step` of a mixture-of-experts model
// (nullopt for a dense model, a dense layer or a router it does not model). ref_taps,
// test_taps: one step's whole tap record, [n_layer][TS_TAP_POINTS][n_embd]. Throws
// touchstone::Error when a record's size does not match the model.
std::optional<RoutingDiagnosis> diagnose_routing(const StoredWeights& w, int step, int layer,
                                                 std::span<const float> ref_taps,
                                                 std::span<const float> test_taps);

}  // namespace touchstone
