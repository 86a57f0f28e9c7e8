#version 450
// add.comp - x[i] += y[i] for i < n (the residual add of a block whose output
// was kept apart: post-norms, layer taps). One invocation per element.
#include "common.glsl"

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Yb { float y[]; };

layout(push_constant) uniform PC { uint n; } pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.n) return;
  x[i] += y[i];
}
