// quant.glsl - weight access for one WTYPE_* (F32, Q4_0, Q4_1, Q8_0, Q5_0,
// Q4_K, Q5_K, Q6_K). Weights are bound as 32-bit words (binding W_BINDING,
// array `wq`), plus a uvec4 view of the same buffer (`wq4`). F32 rows are plain
// fp32. Quantized tensors use the device layouts of src/vk_blocks.h:
//  - split (Q4_0, Q4_1, Q8_0; SPLIT_LAYOUT): the quant bytes of block k at
//    words [k * QW, k * QW + QW) (16-byte aligned), then one scale word per
//    block (Q4_1: d | m << 16, Q4_0/Q8_0: d), block k = row * nb + b;
//  - padded (Q5_0, Q4_K, Q5_K, Q6_K): the GGUF block's bytes in BW words per
//    block (Q5_0: 2 zero bytes after d; Q6_K: 2 zero bytes at the end; Q4_K and
//    Q5_K as stored), block k = row * (n_in / BE) + e / BE for element e.
// dequant4(row, q, n_in, n_rows) returns elements 4q..4q+3 of a row.
// Formulas and operation order: ggml dequantize_row_* (model/gguf/src/quant.cpp).
// Faults (faults.glsl): FAULT_NIBBLE_ORDER swaps the low and high nibble of
// each Q4_0/Q4_1 quant byte, FAULT_SCALE_MIN_SWAP reads a Q4_1 block's d as m
// and m as d.
#include "faults.glsl"
#if defined(WTYPE_F32)
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1)
#define QW 4u
#define SPLIT_LAYOUT
#elif defined(WTYPE_Q8_0)
#define QW 8u
#define SPLIT_LAYOUT
#elif defined(WTYPE_Q5_0)
#define BW 6u
#define BE 32u
#elif defined(WTYPE_Q4_K)
#define BW 36u
#define BE 256u
#elif defined(WTYPE_Q5_K)
#define BW 44u
#define BE 256u
#elif defined(WTYPE_Q6_K)
#define BW 53u
#define BE 256u
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
#elif defined(WTYPE_Q5_0)
// Block at word `base`: d, qh (bit i: 5th bit of element i), qs (element i <
// 16: low nibble of byte i, else high nibble of byte i - 16). (q - 16) * d.
vec4 quad_q5_0(uint base, uint j) {
  const float d = unpackHalf2x16(wq[base]).x;
  const uint qh = wq[base + 1u], qw = wq[base + 2u + (j & 3u)];
  const uint sh = j >= 4u ? 4u : 0u;
  vec4 v;
  for (uint c = 0u; c < 4u; ++c) {
    const uint q = ((qw >> (8u * c + sh)) & 15u) | (((qh >> (4u * j + c)) & 1u) << 4);
    v[c] = float(int(q) - 16) * d;
  }
  return v;
}
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// Byte i of the 12 packed scale bytes (words 1..3 of the super-block).
uint scale_byte(uint base, uint i) { return (wq[base + 1u + i / 4u] >> (8u * (i % 4u))) & 255u; }
// ggml get_scale_min_k4: the 6-bit (scale, min) of sub-block b (0..7).
uvec2 scale_min_k4(uint base, uint b) {
  if (b < 4u) return uvec2(scale_byte(base, b) & 63u, scale_byte(base, b + 4u) & 63u);
  const uint hi = scale_byte(base, b + 4u);
  return uvec2((hi & 15u) | ((scale_byte(base, b - 4u) >> 6) << 4),
               (hi >> 4) | ((scale_byte(base, b) >> 6) << 4));
}
// Quad j of sub-block b of the super-block at word `base`:
// d * sc * q - dmin * m (Q5_K: q gains the 5th bit from qh, bit b of byte l).
vec4 quad_k(uint base, uint b, uint j) {
  const vec2 dm = unpackHalf2x16(wq[base]);
  const uvec2 sm = scale_min_k4(base, b);
  const float d1 = dm.x * float(sm.x), m1 = dm.y * float(sm.y);
#if defined(WTYPE_Q4_K)
  const uint qw = wq[base + 4u + (b / 2u) * 8u + j];
  return d1 * nibbles(qw, 4u * (b & 1u)) - m1;
#else
  const uint qw = wq[base + 12u + (b / 2u) * 8u + j], hw = wq[base + 4u + j];
  const vec4 h = vec4(float((hw >> b) & 1u), float((hw >> (8u + b)) & 1u),
                      float((hw >> (16u + b)) & 1u), float((hw >> (24u + b)) & 1u));
  return d1 * (nibbles(qw, 4u * (b & 1u)) + 16.0 * h) - m1;
#endif
}
#elif defined(WTYPE_Q6_K)
// Quad j of 32-element group b (half n = b / 4, quarter g = b % 4) of the
// super-block at word `base`: ql (128 B), qh (64 B), int8 scales (16 B), d.
// d * sc * (q - 32), q = 4 bits of ql | 2 bits of qh << 4.
vec4 quad_q6_k(uint base, uint b, uint j) {
  const uint n = b / 4u, g = b % 4u;
  const uint lw = wq[base + n * 16u + (g & 1u) * 8u + j], hw = wq[base + 32u + n * 8u + j];
  const uint ls = g >= 2u ? 4u : 0u, hs = 2u * g;
  const uint si = 192u + n * 8u + j / 4u + 2u * g;  // scale byte
  const int sc = bitfieldExtract(int(wq[base + si / 4u]), int(8u * (si % 4u)), 8);
  const float d = unpackHalf2x16(wq[base + 52u]).x;
  vec4 v;
  for (uint c = 0u; c < 4u; ++c) {
    const uint q = ((lw >> (8u * c + ls)) & 15u) | (((hw >> (8u * c + hs)) & 3u) << 4);
    v[c] = d * float(sc) * float(int(q) - 32);
  }
  return v;
}
#endif

#if !defined(WTYPE_F32) && !defined(SPLIT_LAYOUT)
// The 8 quads of 32-element block b of a row (padded layouts), each block
// header (scales, mins, high bits) decoded once: matmul_rows.comp's inner
// loop. Same values as dequant4(row, 8 b + j, n_in, ...), j = 0..7.
void block_quads(uint row, uint b, uint n_in, out vec4 quads[8]) {
#if defined(WTYPE_Q5_0)
  const uint base = (row * (n_in / 32u) + b) * BW;
  const float d = unpackHalf2x16(wq[base]).x;
  const uint qh = wq[base + 1u];
  for (uint j = 0u; j < 8u; ++j) {
    const uint qw = wq[base + 2u + (j & 3u)], sh = j >= 4u ? 4u : 0u;
    for (uint c = 0u; c < 4u; ++c) {
      const uint q = ((qw >> (8u * c + sh)) & 15u) | (((qh >> (4u * j + c)) & 1u) << 4);
      quads[j][c] = float(int(q) - 16) * d;
    }
  }
#elif defined(WTYPE_Q6_K)
  const uint base = (row * (n_in / BE) + b / 8u) * BW, sb = b % 8u, n = sb / 4u, g = sb % 4u;
  const float d = unpackHalf2x16(wq[base + 52u]).x;
  const uint si = 192u + n * 8u + 2u * g;  // scale byte of elements 0..15; + 1 for 16..31
  const int sc0 = bitfieldExtract(int(wq[base + si / 4u]), int(8u * (si % 4u)), 8);
  const int sc1 = bitfieldExtract(int(wq[base + (si + 1u) / 4u]), int(8u * ((si + 1u) % 4u)), 8);
  const uint ls = g >= 2u ? 4u : 0u, hs = 2u * g;
  for (uint j = 0u; j < 8u; ++j) {
    const uint lw = wq[base + n * 16u + (g & 1u) * 8u + j], hw = wq[base + 32u + n * 8u + j];
    const float dsc = d * float(j < 4u ? sc0 : sc1);
    for (uint c = 0u; c < 4u; ++c) {
      const uint q = ((lw >> (8u * c + ls)) & 15u) | (((hw >> (8u * c + hs)) & 3u) << 4);
      quads[j][c] = dsc * float(int(q) - 32);
    }
  }
#else
  const uint base = (row * (n_in / BE) + b / 8u) * BW, sb = b % 8u;
  const vec2 dm = unpackHalf2x16(wq[base]);
  const uvec2 sm = scale_min_k4(base, sb);
  const float d1 = dm.x * float(sm.x), m1 = dm.y * float(sm.y);
  for (uint j = 0u; j < 8u; ++j) {
#if defined(WTYPE_Q4_K)
    quads[j] = d1 * nibbles(wq[base + 4u + (sb / 2u) * 8u + j], 4u * (sb & 1u)) - m1;
#else
    const uint qw = wq[base + 12u + (sb / 2u) * 8u + j], hw = wq[base + 4u + j];
    const vec4 h = vec4(float((hw >> sb) & 1u), float((hw >> (8u + sb)) & 1u),
                        float((hw >> (16u + sb)) & 1u), float((hw >> (24u + sb)) & 1u));
    quads[j] = d1 * (nibbles(qw, 4u * (sb & 1u)) + 16.0 * h) - m1;
#endif
  }
#endif
}
#endif

vec4 dequant4(uint row, uint q, uint n_in, uint n_rows) {
#if defined(WTYPE_F32)
  const uint i = row * n_in + 4u * q;
  return vec4(uintBitsToFloat(wq[i]), uintBitsToFloat(wq[i + 1u]), uintBitsToFloat(wq[i + 2u]),
              uintBitsToFloat(wq[i + 3u]));
#elif defined(SPLIT_LAYOUT)
  const uint nb = n_in / 32u, k = row * nb + (q >> 3), j = q & 7u;
  const uint scale = wq[n_rows * nb * QW + k];
#if defined(WTYPE_Q4_0)
  return quad_q4_0(scale, wq[k * QW + (j & 3u)], j);
#elif defined(WTYPE_Q4_1)
  return quad_q4_1(scale, wq[k * QW + (j & 3u)], j);
#else
  return bytes_i8(wq[k * QW + j]) * unpackHalf2x16(scale).x;
#endif
#else
  const uint e = 4u * q, base = (row * (n_in / BE) + e / BE) * BW, j = q & 7u;
#if defined(WTYPE_Q5_0)
  return quad_q5_0(base, j);
#elif defined(WTYPE_Q6_K)
  return quad_q6_k(base, (e % BE) / 32u, j);
#else
  return quad_k(base, (e % BE) / 32u, j);
#endif
#endif
}
