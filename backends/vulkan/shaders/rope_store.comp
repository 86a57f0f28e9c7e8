#version 450
// rope_store.comp - interleaved RoPE (pairs 2i, 2i+1, see llama_forward.cpp) on
// Q in place and on K, then K and V are stored into this layer's KV cache at
// positions pos0 + t. cos/sin come from a table computed on the host in fp64:
// rope[(pos * hd/2 + i)] = (cos, sin). One workgroup per token.
#include "common.glsl"

layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KC { float kc[]; };
layout(std430, binding = 4) writeonly buffer VC { float vc[]; };
layout(std430, binding = 5) readonly buffer Rope { vec2 rope[]; };

layout(push_constant) uniform PC {
  uint n_tok, pos0, n_head, n_head_kv, hd;
} pc;

void main() {
  const uint t = gl_WorkGroupID.x;
  const uint pos = pc.pos0 + t;
  const uint half_hd = pc.hd / 2u;
  const uint q_dim = pc.n_head * pc.hd, kv_dim = pc.n_head_kv * pc.hd;
  for (uint p = gl_LocalInvocationID.x; p < q_dim / 2u; p += WG) {
    const vec2 cs = rope[pos * half_hd + p % half_hd];
    const uint i = t * q_dim + 2u * p;
    const float x0 = q[i], x1 = q[i + 1u];
    q[i] = x0 * cs.x - x1 * cs.y;
    q[i + 1u] = x0 * cs.y + x1 * cs.x;
  }
  for (uint p = gl_LocalInvocationID.x; p < kv_dim / 2u; p += WG) {
    const vec2 cs = rope[pos * half_hd + p % half_hd];
    const uint i = t * kv_dim + 2u * p;
    const float x0 = k[i], x1 = k[i + 1u];
    const uint c = pos * kv_dim + 2u * p;
    kc[c] = x0 * cs.x - x1 * cs.y;
    kc[c + 1u] = x0 * cs.y + x1 * cs.x;
    vc[c] = v[i];
    vc[c + 1u] = v[i + 1u];
  }
}
