#version 450
// swiglu.comp - gate[i] = SiLU(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up.
#include "common.glsl"

layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform PC { uint n; } pc;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_WorkGroupID.y * 65535u * WG;
  if (i >= pc.n) return;
  const float x = g[i];
  g[i] = x / (1.0 + exp(-x)) * u[i];
}
