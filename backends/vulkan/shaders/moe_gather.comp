#version 450
// moe_gather.comp - dst[g][i] = src[route[row_off + g]][i] for rows g < n_rows and
// i < n: the normed input rows of a mixture-of-experts layer copied into the
// order of the experts that use them (grouped row g is token route[row_off + g];
// src/vk_moe.cpp). One invocation per element, grouped row g = workgroup y.
#include "common.glsl"

layout(std430, binding = 0) readonly buffer S { float src[]; };
layout(std430, binding = 1) readonly buffer R { uint route[]; };
layout(std430, binding = 2) writeonly buffer D { float dst[]; };

layout(push_constant) uniform PC { uint n, n_rows, row_off; } pc;

void main() {
  const uint i = gl_GlobalInvocationID.x, g = gl_WorkGroupID.y;
  if (i >= pc.n || g >= pc.n_rows) return;
  dst[g * pc.n + i] = src[route[pc.row_off + g] * pc.n + i];
}
