#version 450
// get_rows.comp - token embedding lookup: out[t][:] = dequant(W[tokens[t]][:]) * scale
// (scale: the embedding multiplier, Gemma's fp32(sqrt(n_embd)), else 1).
// One workgroup per token. W may be one part of a larger table (row0, n_rows).
#include "common.glsl"
#define W_BINDING 0
#include "quant.glsl"

layout(std430, binding = 1) readonly buffer Tokens { int tokens[]; };
layout(std430, binding = 2) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform PC {
  uint n;        // row length
  uint n_tok;
  uint out_off;  // out[t][i] = outv[out_off + t * n + i]
  uint n_rows;   // rows of W (the vocabulary)
  float scale;   // embedding scale
  uint row0;     // W holds table rows [row0, row0 + n_rows): tokens outside are skipped
} pc;

void main() {
  const uint t = gl_WorkGroupID.x;
  const uint row = uint(tokens[t]) - pc.row0;  // wraps past n_rows for tokens < row0
  if (row >= pc.n_rows) return;
  for (uint q = gl_LocalInvocationID.x; q < pc.n / 4u; q += WG) {
    const vec4 w = dequant4(row, q, pc.n, pc.n_rows) * pc.scale;
    const uint oi = pc.out_off + t * pc.n + 4u * q;
    outv[oi] = w.x;
    outv[oi + 1u] = w.y;
    outv[oi + 2u] = w.z;
    outv[oi + 3u] = w.w;
  }
}
