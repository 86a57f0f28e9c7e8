#version 450
// rope_store.comp - interleaved RoPE (pairs 2i, 2i+1, see reference_forward.cpp) on
// Q in place and on K, then K and V are stored into this layer's KV cache at
// positions pos0 + t. cos/sin come from a table computed on the host in fp64:
// rope[(pos * hd/2 + i)] = (cos, sin). One workgroup per token. Faults
// (faults.glsl): FAULT_ROPE_LAYOUT rotates the NeoX pairs (i, i + hd/2) of each
// head instead, FAULT_KV_WRITE_NEXT stores K/V of position pos in cache row
// pos + 1 (the host allocates one spare row).
#include "common.glsl"
#include "faults.glsl"

layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KC { float kc[]; };
layout(std430, binding = 4) writeonly buffer VC { float vc[]; };
layout(std430, binding = 5) readonly buffer Rope { vec2 rope[]; };

layout(push_constant) uniform PC {
  uint n_tok, pos0, n_head, n_head_kv, hd;
  uint rope_origin;  // 0 (prefill_position_reset fault: rotate pos - rope_origin)
} pc;

// Offsets in a token's Q or K row of RoPE pair p (p / (hd/2) = head, p % (hd/2) = i).
uvec2 pair(uint p, uint half_hd) {
  if (FAULT_ROPE_LAYOUT) {
    const uint a = (p / half_hd) * pc.hd + p % half_hd;
    return uvec2(a, a + half_hd);
  }
  return uvec2(2u * p, 2u * p + 1u);
}

void main() {
  const uint t = gl_WorkGroupID.x;
  const uint pos = pc.pos0 + t;
  const uint rpos = pos - pc.rope_origin;
  const uint half_hd = pc.hd / 2u;
  const uint q_dim = pc.n_head * pc.hd, kv_dim = pc.n_head_kv * pc.hd;
  for (uint p = gl_LocalInvocationID.x; p < q_dim / 2u; p += WG) {
    const vec2 cs = rope[rpos * half_hd + p % half_hd];
    const uvec2 i = t * q_dim + pair(p, half_hd);
    const float x0 = q[i.x], x1 = q[i.y];
    q[i.x] = x0 * cs.x - x1 * cs.y;
    q[i.y] = x0 * cs.y + x1 * cs.x;
  }
  const uint row = FAULT_KV_WRITE_NEXT ? pos + 1u : pos;
  for (uint p = gl_LocalInvocationID.x; p < kv_dim / 2u; p += WG) {
    const vec2 cs = rope[rpos * half_hd + p % half_hd];
    const uvec2 e = pair(p, half_hd);
    const uvec2 i = t * kv_dim + e, c = row * kv_dim + e;
    const float x0 = k[i.x], x1 = k[i.y];
    kc[c.x] = x0 * cs.x - x1 * cs.y;
    kc[c.y] = x0 * cs.y + x1 * cs.x;
    vc[c.x] = v[i.x];
    vc[c.y] = v[i.y];
  }
}
