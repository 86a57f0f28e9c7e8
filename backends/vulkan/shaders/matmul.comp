#version 450
// matmul.comp - Y[t][o] (+)= sum_i W[o][i] * X[t][i] for a tile of up to TILE
// tokens per workgroup: each weight quad is dequantized once and used for every
// token of the tile (matrix-vector when n_tok == 1, matrix-matrix otherwise).
// One workgroup per output row o (x, plus z * 32768) and token tile (y), the
// row split across the workgroup and summed with wg_sum (subgroup or shared
// memory); fp32 accumulation. The GPU strategy; CPU devices use matmul_rows.comp.
// Faults (faults.glsl, specialization constants): FAULT_FP16_OUT rounds each
// output through fp16, FAULT_SPLIT_K > 1 sums each row in slices.
#define TILE 8
#include "common.glsl"
#include "faults.glsl"
#define W_BINDING 0
#include "quant.glsl"

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n_in, n_out, n_tok;
  uint x_off, x_stride;   // X[t][i] = x[x_off + t * x_stride + i]
  uint y_off, y_stride;   // Y[t][o] = y[y_off + t * y_stride + o]
  uint accumulate;        // 1: Y += W X (residual add), 0: Y = W X
} pc;

// acc[t] += this invocation's share of quads [q0, q1) of row . X[t0 + t].
void add_quads(uint row, uint q0, uint q1, uint t0, uint n_tile, inout float acc[TILE]) {
  for (uint q = q0 + gl_LocalInvocationID.x; q < q1; q += WG) {
    const vec4 w = dequant4(row, q, pc.n_in, pc.n_out);
    for (uint t = 0; t < n_tile; ++t) {
      const uint xi = pc.x_off + (t0 + t) * pc.x_stride + 4u * q;
      acc[t] += dot(w, vec4(x[xi], x[xi + 1u], x[xi + 2u], x[xi + 3u]));
    }
  }
}

void main() {
  const uint o = gl_WorkGroupID.x + gl_WorkGroupID.z * 32768u;
  const uint t0 = gl_WorkGroupID.y * TILE;
  const uint tid = gl_LocalInvocationID.x;
  const bool row_ok = o < pc.n_out;  // keep every invocation for the barriers
  const uint n_tile = min(uint(TILE), pc.n_tok - t0);
  const uint row = row_ok ? o : 0u;
  const uint n4 = pc.n_in / 4u;

  float acc[TILE];
  for (int t = 0; t < TILE; ++t) acc[t] = 0.0;
  if (FAULT_SPLIT_K > 1u) {
    // thread_order_reduction fault: FAULT_SPLIT_K slices of the row, each
    // reduced over the workgroup and rounded through fp16 (a half-precision
    // split-K scratch), the slices added in order.
    float part[TILE];
    for (uint s = 0; s < FAULT_SPLIT_K; ++s) {
      for (int t = 0; t < TILE; ++t) part[t] = 0.0;
      const uint q0 = n4 * s / FAULT_SPLIT_K, q1 = n4 * (s + 1u) / FAULT_SPLIT_K;
      if (row_ok) add_quads(row, q0, q1, t0, n_tile, part);
      wg_sum(part);
      for (int t = 0; t < TILE; ++t) acc[t] += fault_round_fp16(part[t]);
    }
  } else {
    if (row_ok) add_quads(row, 0u, n4, t0, n_tile, acc);
    wg_sum(acc);
  }
  if (row_ok && tid == 0u) {
    for (uint t = 0; t < n_tile; ++t) {
      const uint yi = pc.y_off + (t0 + t) * pc.y_stride + o;
      const float v = FAULT_FP16_OUT ? fault_round_fp16(acc[t]) : acc[t];
      y[yi] = pc.accumulate != 0u ? y[yi] + v : v;
    }
  }
}
