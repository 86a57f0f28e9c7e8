#version 450
// glu.comp - the gated FFN activation, in place in gate:
//   SwiGLU (act == 0): gate[i] = SiLU(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up
//   GeGLU  (act == 1): gate[i] = GELU_tanh(gate[i]) * up[i],
//     GELU_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   gpt-oss (act == 2): g = min(gate, limit), u = clamp(up, -limit, limit),
//     gate[i] = (u + 1) * g * sigmoid(alpha * g)   (HF GptOssExperts, ops::swiglu_oai)
// (HF ACT2FN["silu"] / ACT2FN["gelu_pytorch_tanh"], touchstone/scalar_ops.h). fp32.
#include "common.glsl"

layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform PC {
  uint n;       // elements
  uint act;     // 0: SiLU gate, 1: tanh-GELU gate, 2: gpt-oss's clamped SwiGLU
  float alpha;  // act 2: swiglu_alpha
  float limit;  // act 2: swiglu_limit
} pc;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_WorkGroupID.y * 65535u * WG;
  if (i >= pc.n) return;
  const float x = g[i];
  if (pc.act == 2u) {
    const float gc = min(x, pc.limit), uc = clamp(u[i], -pc.limit, pc.limit);
    g[i] = (uc + 1.0) * (gc / (1.0 + exp(-pc.alpha * gc)));
    return;
  }
  float act;
  if (pc.act != 0u) {
    const float k = 0.7978845608028654;  // sqrt(2 / pi)
    act = 0.5 * x * (1.0 + tanh_stable(k * (x + 0.044715 * x * x * x)));
  } else {
    act = x / (1.0 + exp(-x));
  }
  g[i] = act * u[i];
}
