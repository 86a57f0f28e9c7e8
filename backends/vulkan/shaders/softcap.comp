#version 450
// softcap.comp - final logit soft-capping in place: for row r (workgroup y) and
// i < n, x[off + r n + i] = cap * tanh(x[off + r n + i] / cap) (Gemma 2/3
// final_logit_softcapping, touchstone/scalar_ops.h: softcap). fp32.
#include "common.glsl"

layout(std430, binding = 0) buffer X { float x[]; };

layout(push_constant) uniform PC {
  uint n, off;  // row length, first element
  float cap;
} pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.n) return;
  const uint e = pc.off + gl_WorkGroupID.y * pc.n + i;
  x[e] = pc.cap * tanh_stable(x[e] / pc.cap);
}
