// quant.glsl - weight access for one WTYPE_* (F32, Q4_0, Q4_1, Q8_0).
// Weights are bound as 32-bit words (binding W_BINDING, array `wq`), plus a
// uvec4 view of the same buffer (`wq4`). F32 rows are plain fp32. Quantized
// tensors use the split device layout of src/vk_blocks.h: the quant bytes of
// block k at words [k * QW, k * QW + QW) (16-byte aligned), then one scale
// word per block (Q4_1: d | m << 16, Q4_0/Q8_0: d), block k = row * nb + b.
// dequant4(row, q, n_in, n_rows) returns elements 4q..4q+3 of a row.
// Formulas: ggml dequantize_row_*. Faults (faults.glsl): FAULT_NIBBLE_ORDER
// swaps the low and high nibble of each quant byte, FAULT_SCALE_MIN_SWAP reads
// a Q4_1 block's d as m and m as d.
#include "faults.glsl"
#if defined(WTYPE_F32)
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1)
#define QW 4u
#elif defined(WTYPE_Q8_0)
#define QW 8u
#else
#error "define one WTYPE_*"
#endif

layout(std430, binding = W_BINDING) readonly buffer Weights { uint wq[]; };
layout(std430, binding = W_BINDING) readonly buffer Weights4 { uvec4 wq4[]; };

vec4 nibbles(uint w, uint shift) {
  return vec4(float((w >> shift) & 15u), float((w >> (8u + shift)) & 15u),
              float((w >> (16u + shift)) & 15u), float((w >> (24u + shift)) & 15u));
}

vec4 bytes_i8(uint w) {
  const int v = int(w);
  return vec4(float(bitfieldExtract(v, 0, 8)), float(bitfieldExtract(v, 8, 8)),
              float(bitfieldExtract(v, 16, 8)), float(bitfieldExtract(v, 24, 8)));
}

// Quad j (0..7) of a block from its scale word and the quant word(s): quads
// 0..3 are the low nibbles of the 16 quant bytes, quads 4..7 the high ones.
uint nibble_shift(uint j) { return (j >= 4u) != FAULT_NIBBLE_ORDER ? 4u : 0u; }
#if defined(WTYPE_Q4_0)
vec4 quad_q4_0(uint scale, uint qw, uint j) {
  return (nibbles(qw, nibble_shift(j)) - 8.0) * unpackHalf2x16(scale).x;
}
#elif defined(WTYPE_Q4_1)
vec4 quad_q4_1(uint scale, uint qw, uint j) {
  const vec2 dm = FAULT_SCALE_MIN_SWAP ? unpackHalf2x16(scale).yx : unpackHalf2x16(scale);
  return nibbles(qw, nibble_shift(j)) * dm.x + dm.y;
}
#endif

vec4 dequant4(uint row, uint q, uint n_in, uint n_rows) {
#if defined(WTYPE_F32)
  const uint i = row * n_in + 4u * q;
  return vec4(uintBitsToFloat(wq[i]), uintBitsToFloat(wq[i + 1u]), uintBitsToFloat(wq[i + 2u]),
              uintBitsToFloat(wq[i + 3u]));
#else
  const uint nb = n_in / 32u, k = row * nb + (q >> 3), j = q & 7u;
  const uint scale = wq[n_rows * nb * QW + k];
#if defined(WTYPE_Q4_0)
  return quad_q4_0(scale, wq[k * QW + (j & 3u)], j);
#elif defined(WTYPE_Q4_1)
  return quad_q4_1(scale, wq[k * QW + (j & 3u)], j);
#else
  return bytes_i8(wq[k * QW + j]) * unpackHalf2x16(scale).x;
#endif
#endif
}
