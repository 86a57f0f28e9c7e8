#version 450
// attention.comp - causal softmax attention over the KV cache with GQA: query
// head h reads KV head h / (n_head / n_head_kv). One workgroup per (head x,
// token y). Scores go to a scratch row, then softmax, then the weighted sum of V.
// Token t attends entries [j0, n_kv) (j0 > 0 only under a sliding window): n_kv = kv_len - (n_tok - 1 - t), the causal
// limit counted back from the host's filled length (= pos + 1 while the host
// keeps kv_len right; the rewind_noop fault leaves it stale). Faults
// (faults.glsl): FAULT_CAUSAL_MASK (n_kv = kv_len), FAULT_GQA_MAPPING,
// FAULT_SOFTMAX_NO_MAX; push constant drop_newest (kv_position_off_by_one).
#include "common.glsl"
#include "faults.glsl"

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer KC { float kc[]; };
layout(std430, binding = 2) readonly buffer VC { float vc[]; };
layout(std430, binding = 3) buffer S { float sc[]; };
layout(std430, binding = 4) writeonly buffer O { float o[]; };
layout(std430, binding = 5) readonly buffer SK { float sink[]; };  // [n_head] (pc.sinks)

layout(push_constant) uniform PC {
  uint n_tok, pos0, n_head, n_head_kv, hd;
  uint max_ctx;        // scratch row stride
  uint drop_newest;    // fault kv_position_off_by_one: skip the newest entry (pos > 0)
  float scale;         // 1 / sqrt(hd)
  uint kv_len;         // cache entries filled, this chunk included (pos0 + n_tok)
  uint window;       // sliding window W: attend positions (pos - W, pos]; 0 = none
  uint row0;         // first row of this sequence in Q, O and the scratch (batched passes)
  uint sinks;        // 1: sink[h] joins the softmax (gpt-oss): max and denominator
  uint whole_chunk;  // 1: every row attends the whole chunk (an image block, ABI v8)
} pc;

void main() {
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
  const uint pos = pc.pos0 + t;
  const uint n_causal =
      (FAULT_CAUSAL_MASK || pc.whole_chunk != 0u) ? pc.kv_len : pc.kv_len - (pc.n_tok - 1u - t);
  const uint n_kv = (pc.drop_newest != 0u && pos > 0u) ? n_causal - 1u : n_causal;
  // Sliding window (HF sliding_window_overlay): entries [j0, n_kv) with j0 = pos - W + 1.
  const uint j0 = (pc.window != 0u && pos + 1u > pc.window) ? pos + 1u - pc.window : 0u;
  const uint q_dim = pc.n_head * pc.hd, kv_dim = pc.n_head_kv * pc.hd;
  const uint kv_head = FAULT_GQA_MAPPING ? h % pc.n_head_kv : h / (pc.n_head / pc.n_head_kv);
  const uint kv_off = kv_head * pc.hd;
  const uint qb = (pc.row0 + t) * q_dim + h * pc.hd;
  const uint sb = ((pc.row0 + t) * pc.n_head + h) * pc.max_ctx;

  float m = -1.0 / 0.0;
  for (uint j = j0 + tid; j < n_kv; j += WG) {
    const uint kb = j * kv_dim + kv_off;
    float s = 0.0;
    for (uint i = 0; i < pc.hd; ++i) s += q[qb + i] * kc[kb + i];
    s *= pc.scale;
    sc[sb + j] = s;
    m = max(m, s);
  }
  // gpt-oss (HF eager_attention_forward with sinks): the head's sink logit is one more
  // column of the softmax, in its max and its denominator, with no value row.
  if (pc.sinks != 0u) m = max(m, sink[h]);
  m = wg_max(m);
  if (FAULT_SOFTMAX_NO_MAX) m = 0.0;  // exp(s) overflows to inf above ~88.7
  float sum = (pc.sinks != 0u && tid == 0u) ? exp(sink[h] - m) : 0.0;
  for (uint j = j0 + tid; j < n_kv; j += WG) {
    const float e = exp(sc[sb + j] - m);
    sc[sb + j] = e;
    sum += e;
  }
  sum = wg_sum1(sum);
  memoryBarrierBuffer();
  barrier();
  for (uint i = tid; i < pc.hd; i += WG) {
    float acc = 0.0;
    for (uint j = j0; j < n_kv; ++j) acc += sc[sb + j] * vc[j * kv_dim + kv_off + i];
    o[qb + i] = acc / sum;
  }
}
