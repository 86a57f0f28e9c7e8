#version 450
// rms_norm.comp - out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight (HF LlamaRMSNorm).
// One workgroup per token.
#include "common.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform PC {
  uint n, n_tok;
  uint x_off, x_stride;
  uint out_off, out_stride;
  float eps;
} pc;

void main() {
  const uint t = gl_WorkGroupID.x;
  const uint xb = pc.x_off + t * pc.x_stride;
  float ss = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < pc.n; i += WG) ss += x[xb + i] * x[xb + i];
  ss = wg_sum1(ss);
  const float inv = 1.0 / sqrt(ss / float(pc.n) + pc.eps);
  const uint ob = pc.out_off + t * pc.out_stride;
  for (uint i = gl_LocalInvocationID.x; i < pc.n; i += WG) outv[ob + i] = x[xb + i] * inv * w[i];
}
