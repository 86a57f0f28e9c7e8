#version 450
// bias_add.comp - Y[t][o] += b[o] for n_tok rows of n (the Q/K/V biases of
// Qwen2, added after the projection: y = W x + b). One invocation per element.
#include "common.glsl"

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };

layout(push_constant) uniform PC {
  uint n, n_tok;       // row length (== bias length), rows
  uint y_off, b_off;   // first element of y and of b (gpt-oss: an expert's rows and bias)
} pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.n * pc.n_tok) return;
  y[pc.y_off + i] += b[pc.b_off + i % pc.n];
}
