#version 450
// copy.comp - dst[dst_off + i] = src[src_off + i] for i < n (layer taps: one
// activation row into the host-visible tap record). One invocation per element.
#include "common.glsl"

layout(std430, binding = 0) readonly buffer S { float src[]; };
layout(std430, binding = 1) writeonly buffer D { float dst[]; };

layout(push_constant) uniform PC { uint n, src_off, dst_off; } pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.n) return;
  dst[pc.dst_off + i] = src[pc.src_off + i];
}
