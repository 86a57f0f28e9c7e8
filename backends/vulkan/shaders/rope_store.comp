#version 450
// rope_store.comp - RoPE on Q in place and on K, then K and V are stored into
// this layer's KV cache at positions pos0 + t. One workgroup per token. Q/K/V
// rows start at row0 (a batched pass holds several sequences' rows).
// The first n_rot dimensions of each head rotate (partial rotary leaves the
// rest as they are), in pairs (touchstone/scalar_ops.h: rope_interleaved,
// rope_neox):
//   interleaved (neox == 0): pair i = dims (2i, 2i + 1)        (Llama)
//   NeoX        (neox != 0): pair i = dims (i, i + n_rot / 2)  (Qwen2/3, Gemma 3, Phi-3)
//   x0' = x0 cos - x1 sin,  x1' = x0 sin + x1 cos
// cos/sin come from this layer's table, computed on the host in fp64 (base,
// linear scaling and frequency factors folded in): rope[pos * n_rot/2 + i] =
// (cos, sin). Faults (faults.glsl): FAULT_ROPE_LAYOUT rotates the other
// layout's pairs, FAULT_KV_WRITE_NEXT stores K/V of position pos in cache row
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
  uint n_rot;        // rotated dims per head (even, <= hd)
  uint neox;         // 1: NeoX pairs, 0: interleaved
  uint row0;         // first row of this sequence in Q/K/V (a batched pass holds several)
} pc;

// Offsets in a head of the two dims of pair i.
uvec2 pair(uint i, uint half_rot) {
  if ((pc.neox != 0u) != FAULT_ROPE_LAYOUT) return uvec2(i, i + half_rot);
  return uvec2(2u * i, 2u * i + 1u);
}

void main() {
  const uint t = gl_WorkGroupID.x;  // the sequence's token t: row row0 + t of Q/K/V
  const uint pos = pc.pos0 + t;
  const uint tr = pc.row0 + t;
  const uint rpos = pos - pc.rope_origin;
  const uint half_rot = pc.n_rot / 2u;
  const uint q_dim = pc.n_head * pc.hd, kv_dim = pc.n_head_kv * pc.hd;
  for (uint p = gl_LocalInvocationID.x; p < pc.n_head * half_rot; p += WG) {
    const uint i = p % half_rot;
    const vec2 cs = rope[rpos * half_rot + i];
    const uvec2 e = tr * q_dim + (p / half_rot) * pc.hd + pair(i, half_rot);
    const float x0 = q[e.x], x1 = q[e.y];
    q[e.x] = x0 * cs.x - x1 * cs.y;
    q[e.y] = x0 * cs.y + x1 * cs.x;
  }
  const uint row = FAULT_KV_WRITE_NEXT ? pos + 1u : pos;
  for (uint p = gl_LocalInvocationID.x; p < pc.n_head_kv * half_rot; p += WG) {
    const uint i = p % half_rot;
    const vec2 cs = rope[rpos * half_rot + i];
    const uvec2 e = (p / half_rot) * pc.hd + pair(i, half_rot);
    const uvec2 s = tr * kv_dim + e, c = row * kv_dim + e;
    const float x0 = k[s.x], x1 = k[s.y];
    kc[c.x] = x0 * cs.x - x1 * cs.y;
    kc[c.y] = x0 * cs.y + x1 * cs.x;
  }
  // V, and K's dims past n_rot, stored as they are.
  for (uint j = gl_LocalInvocationID.x; j < kv_dim; j += WG) {
    vc[row * kv_dim + j] = v[tr * kv_dim + j];
    if (j % pc.hd >= pc.n_rot) kc[row * kv_dim + j] = k[tr * kv_dim + j];
  }
}
