#version 450
// moe_sum.comp - the output of a mixture-of-experts layer for n_tok rows:
//   out[t][c] = sum_{j < k} w[t k + j] * eo[pos[t k + j]][c]
// (HF MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: the selected experts' outputs
// times their routing weights, summed). eo holds the expert outputs grouped by
// expert; slot t k + j (token t's j-th choice, the router's order) is grouped row
// pos[t k + j] with weight w[t k + j] (fp32 bits), both in `route` (src/vk_moe.cpp).
// The terms are added in the router's order j = 0, 1, ..., k - 1 from 0 in fp32,
// the product and the sum each rounded (`precise`: never contracted into an fma,
// which llvmpipe does not fuse anyway), so every device computes the same bits
// (the reference sums the same terms in the same order in fp64, rounded once).
// With a shared expert (qwen2moe, pc.has_shared = 1; HF Qwen2MoeSparseMoeBlock): then
// + sigma[t] * sh[t][c], sigma[t] = sigmoid of the row's shared-expert gate logit
// (computed on the host in fp64, fp32 bits in `route` at sig_off + t), the product
// and the sum rounded as above (the reference adds the same term last in fp64).
// One invocation per element, token t = workgroup y.
#include "common.glsl"

layout(std430, binding = 0) readonly buffer E { float eo[]; };
layout(std430, binding = 1) readonly buffer R { uint route[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 3) readonly buffer S { float sh[]; };  // [n_tok][n] (shared expert)

layout(push_constant) uniform PC {
  uint n, n_tok, k;     // row length, rows, experts per token
  uint pos_off, w_off;  // pos and w in route
  uint has_shared, sig_off;  // shared expert on; its sigmas in route
} pc;

void main() {
  const uint c = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (c >= pc.n || t >= pc.n_tok) return;
  precise float acc = 0.0;
  for (uint j = 0u; j < pc.k; ++j) {
    const uint s = t * pc.k + j;
    acc = acc + uintBitsToFloat(route[pc.w_off + s]) * eo[route[pc.pos_off + s] * pc.n + c];
  }
  if (pc.has_shared != 0u) acc = acc + uintBitsToFloat(route[pc.sig_off + t]) * sh[t * pc.n + c];
  o[t * pc.n + c] = acc;
}
