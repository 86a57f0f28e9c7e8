#version 450
// attention_rows.comp - attention.comp for CPU devices (lavapipe): same
// bindings, push constants, grid (head x, token y) and formulas, but one
// subgroup of 8 invocations per workgroup (no barriers) and vec4 loads.
// Invocation l scores keys l, l + 8, ...: the query (HD floats, fixed at
// compile time) stays in registers and each key is read as HD/4 vec4s; max and
// sum are subgroup reductions; each invocation then adds exp-weighted V rows of
// its own keys and the partial sums are added across the subgroup (fp32, an
// order that depends only on the number of keys). The host uses it when
// head_dim == HD and subgroups are 8 wide
// (the CPU matmul strategy, which also needs shaderInt64). Attended entries
// and faults: as attention.comp.
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_ARB_gpu_shader_int64 : require
#extension GL_GOOGLE_include_directive : require
#include "faults.glsl"

#define LANES 8
#ifndef HD
#define HD 64
#endif

layout(local_size_x = LANES, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };
// K and V rows through u64vec2 (4 floats in 2 components: llvmpipe's load loop
// costs per component, see matmul_rows.comp).
layout(std430, binding = 1) readonly buffer KC { u64vec2 kc4[]; };
layout(std430, binding = 2) readonly buffer VC { u64vec2 vc4[]; };
layout(std430, binding = 3) buffer S { float sc[]; };
layout(std430, binding = 4) writeonly buffer O { vec4 o4[]; };
layout(std430, binding = 5) readonly buffer SK { float sink[]; };  // [n_head] (pc.sinks)

layout(push_constant) uniform PC {
  uint n_tok, pos0, n_head, n_head_kv, hd;
  uint max_ctx;      // scratch row stride
  uint drop_newest;  // fault kv_position_off_by_one: skip the newest entry (pos > 0)
  float scale;       // 1 / sqrt(hd)
  uint kv_len;       // cache entries filled, this chunk included (pos0 + n_tok)
  uint window;       // sliding window W: attend positions (pos - W, pos]; 0 = none
  uint row0;         // first row of this sequence in Q, O and the scratch (batched passes)
  uint sinks;        // 1: sink[h] joins the softmax (gpt-oss): max and denominator
  uint whole_chunk;  // 1: every row attends the whole chunk (an image block, ABI v8)
}
pc;

vec4 floats4(u64vec2 v) {
  return vec4(uintBitsToFloat(unpackUint2x32(v.x)), uintBitsToFloat(unpackUint2x32(v.y)));
}

void main() {
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, lane = gl_SubgroupInvocationID;
  const uint pos = pc.pos0 + t;
  const uint n_causal =
      (FAULT_CAUSAL_MASK || pc.whole_chunk != 0u) ? pc.kv_len : pc.kv_len - (pc.n_tok - 1u - t);
  const uint n_kv = (pc.drop_newest != 0u && pos > 0u) ? n_causal - 1u : n_causal;
  // Sliding window (HF sliding_window_overlay): entries [j0, n_kv) with j0 = pos - W + 1.
  const uint j0 = (pc.window != 0u && pos + 1u > pc.window) ? pos + 1u - pc.window : 0u;
  const uint q_dim4 = pc.n_head * HD / 4u, kv_dim4 = pc.n_head_kv * HD / 4u;
  const uint kv_head = FAULT_GQA_MAPPING ? h % pc.n_head_kv : h / (pc.n_head / pc.n_head_kv);
  const uint kv_off4 = kv_head * HD / 4u;
  const uint qb4 = (pc.row0 + t) * q_dim4 + h * HD / 4u;
  const uint sb = ((pc.row0 + t) * pc.n_head + h) * pc.max_ctx;

  vec4 qv[HD / 4];
  [[unroll]] for (uint c = 0; c < HD / 4; ++c) qv[c] = q4[qb4 + c];
  float m = -1.0 / 0.0;
  for (uint j = j0 + lane; j < n_kv; j += LANES) {
    const uint kb4 = j * kv_dim4 + kv_off4;
    float s = 0.0;
    [[unroll]] for (uint c = 0; c < HD / 4; ++c) s += dot(qv[c], floats4(kc4[kb4 + c]));
    s *= pc.scale;
    sc[sb + j] = s;
    m = max(m, s);
  }
  if (pc.sinks != 0u) m = max(m, sink[h]);  // gpt-oss: as attention.comp
  m = subgroupMax(m);
  if (FAULT_SOFTMAX_NO_MAX) m = 0.0;  // exp(s) overflows to inf above ~88.7
  float sum = (pc.sinks != 0u && lane == 0u) ? exp(sink[h] - m) : 0.0;
  for (uint j = j0 + lane; j < n_kv; j += LANES) {
    const float e = exp(sc[sb + j] - m);
    sc[sb + j] = e;
    sum += e;
  }
  sum = subgroupAdd(sum);
  // Weighted sum of V: invocation l adds its own keys (l, l + 8, ...), then
  // the 8 partial sums are added across the subgroup.
  vec4 acc[HD / 4];
  [[unroll]] for (uint c = 0; c < HD / 4; ++c) acc[c] = vec4(0.0);
  for (uint j = j0 + lane; j < n_kv; j += LANES) {
    const float e = sc[sb + j];
    const uint vb4 = j * kv_dim4 + kv_off4;
    [[unroll]] for (uint c = 0; c < HD / 4; ++c) acc[c] += e * floats4(vc4[vb4 + c]);
  }
  [[unroll]] for (uint c = 0; c < HD / 4; ++c) {
    const vec4 a = subgroupAdd(acc[c]) / sum;
    if (lane == c % LANES) o4[qb4 + c] = a;
  }
}
