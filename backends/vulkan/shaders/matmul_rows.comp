#version 450
// matmul_rows.comp - Y[t][o] (+)= sum_i W[o][i] * X[t][i], the strategy for CPU
// devices (lavapipe): one subgroup of 8 invocations per workgroup, no barriers,
// no cross-lane sums. Each invocation owns ROWS output rows
// (o = group * 8 * ROWS + r * 8 + lane, group = x + z * 32768) and the TILE
// tokens t0 + t (t0 = group.y * TILE), so every weight load serves TILE tokens.
// The row is walked in blocks of 32 elements (8 quads): lane l loads quad l of
// the block of X for each token (one 16-byte load) and the 8 quads are handed
// round with subgroupShuffle, so X costs one load per block and token instead
// of eight. On llvmpipe every buffer load is a loop over the SIMD lanes whatever
// the addresses, costing per component, so weights come through 64-bit vector
// views: F32 as u64vec4 (8 floats), per block 16 quant bytes as u64vec2 (32
// as u64vec4 for Q8_0) and one scale word, in the split layout of
// src/vk_blocks.h; dequantized in registers. The padded layouts (Q5_0, Q4_K,
// Q5_K, Q6_K) are decoded a block at a time by quant.glsl's block_quads.
// fp32 accumulation, one quad at a time in element order, the same order for
// every TILE. Rows past n_out compute row n_out - 1 and store nothing; tokens
// past n_tok compute token n_tok - 1. Needs subgroup size 8 and shaderInt64
// (the context checks), n_in % 32 == 0, x_off and x_stride multiples of 4 (the
// host checks; else matmul.comp runs). Faults (faults.glsl, specialization
// constants): FAULT_FP16_OUT rounds each output through fp16, FAULT_SPLIT_K > 1
// sums each row in slices (add_blocks_split_k).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_ARB_gpu_shader_int64 : require
#include "faults.glsl"

#ifndef TILE
#define TILE 8
#endif
#ifndef ROWS
#define ROWS 4
#endif
#define LANES 8

layout(local_size_x = LANES, local_size_y = 1, local_size_z = 1) in;

#if defined(WTYPE_F32)
layout(std430, binding = 0) readonly buffer W32 { u64vec4 w32[]; };  // 8 floats
#else
#define W_BINDING 0
#include "quant.glsl"
layout(std430, binding = 0) readonly buffer W16 { u64vec2 w16[]; };  // 16 quant bytes
layout(std430, binding = 0) readonly buffer W32 { u64vec4 w32[]; };  // 32 quant bytes
#endif
layout(std430, binding = 1) readonly buffer X16 { u64vec2 x16[]; };  // 4 floats
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n_in, n_out, n_tok;
  uint x_off, x_stride;  // X[t][i] = x[x_off + t * x_stride + i]
  uint y_off, y_stride;  // Y[t][o] = y[y_off + t * y_stride + o]
  uint accumulate;       // 1: Y += W X (residual add), 0: Y = W X
}
pc;

float acc[ROWS][TILE];
vec4 xl[TILE];  // this lane's quad of the current block, per token

vec2 floats2(uint64_t v) { return uintBitsToFloat(unpackUint2x32(v)); }
vec4 floats4(u64vec2 v) { return vec4(floats2(v.x), floats2(v.y)); }
uvec4 words4(u64vec2 v) { return uvec4(unpackUint2x32(v.x), unpackUint2x32(v.y)); }

// acc[r][t] += dot(w[r], X[t][quad j of the block]).
void fma_quad(const vec4 w[ROWS], uint j) {
  [[unroll]] for (uint t = 0; t < TILE; ++t) {
    const vec4 xv = subgroupShuffle(xl[t], j);
    [[unroll]] for (int r = 0; r < ROWS; ++r) acc[r][t] += dot(w[r], xv);
  }
}

// Per invocation: its rows (clamped to n_out - 1), the quad index of its X quad
// in block 0 per token (tokens past n_tok read token n_tok - 1), first scale word.
uint row[ROWS];
uint xq[TILE];
uint scale0;

// acc[r][t] += the dot products of blocks [b0, b1) of the rows with X[t].
void add_blocks(uint b0, uint b1) {
  const uint nb = pc.n_in / 32u;
  vec4 w[ROWS];
  for (uint b = b0; b < b1; ++b) {
    [[unroll]] for (uint t = 0; t < TILE; ++t) xl[t] = floats4(x16[xq[t] + 8u * b]);
#if defined(WTYPE_F32)
    [[unroll]] for (uint jj = 0; jj < 4u; ++jj) {
      vec4 w_hi[ROWS];
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        const u64vec4 v = w32[(row[r] * nb + b) * 4u + jj];
        w[r] = floats4(v.xy);
        w_hi[r] = floats4(v.zw);
      }
      fma_quad(w, 2u * jj);
      fma_quad(w_hi, 2u * jj + 1u);
    }
#elif !defined(SPLIT_LAYOUT)
    // Padded block layouts (Q5_0, K-quants; src/vk_blocks.h): each row's block
    // decoded once (quant.glsl: block_quads), then used quad by quad.
    vec4 blk[ROWS][8];
    [[unroll]] for (int r = 0; r < ROWS; ++r) block_quads(row[r], b, pc.n_in, blk[r]);
    [[unroll]] for (uint j = 0; j < 8u; ++j) {
      [[unroll]] for (int r = 0; r < ROWS; ++r) w[r] = blk[r][j];
      fma_quad(w, j);
    }
#else
    // Split block layout (src/vk_blocks.h): the quants as uvec4s, one scale word.
    uint scale[ROWS];
    uvec4 qa[ROWS];
#if defined(WTYPE_Q8_0)
    uvec4 qb[ROWS];
#endif
    [[unroll]] for (int r = 0; r < ROWS; ++r) {
      const uint k = row[r] * nb + b;
      scale[r] = wq[scale0 + k];
#if defined(WTYPE_Q8_0)
      const u64vec4 v = w32[k];
      qa[r] = words4(v.xy);
      qb[r] = words4(v.zw);
#else
      qa[r] = words4(w16[k]);
#endif
    }
    [[unroll]] for (uint j = 0; j < 8u; ++j) {
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
#if defined(WTYPE_Q4_0)
        w[r] = quad_q4_0(scale[r], qa[r][j & 3u], j);
#elif defined(WTYPE_Q4_1)
        w[r] = quad_q4_1(scale[r], qa[r][j & 3u], j);
#else
        w[r] = bytes_i8(j < 4u ? qa[r][j & 3u] : qb[r][j & 3u]) * unpackHalf2x16(scale[r]).x;
#endif
      }
      fma_quad(w, j);
    }
#endif
  }
}

// The thread_order_reduction fault (faults.glsl): FAULT_SPLIT_K slices of
// whole blocks, each slice's partial sum rounded through fp16 as if staged in a
// half-precision split-K scratch buffer, the slices added in order.
void add_blocks_split_k(uint nb) {
  float total[ROWS][TILE];
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    [[unroll]] for (int t = 0; t < TILE; ++t) total[r][t] = 0.0;
  }
  for (uint s = 0; s < FAULT_SPLIT_K; ++s) {
    [[unroll]] for (int r = 0; r < ROWS; ++r) {
      [[unroll]] for (int t = 0; t < TILE; ++t) acc[r][t] = 0.0;
    }
    add_blocks(nb * s / FAULT_SPLIT_K, nb * (s + 1u) / FAULT_SPLIT_K);
    [[unroll]] for (int r = 0; r < ROWS; ++r) {
      [[unroll]] for (int t = 0; t < TILE; ++t) total[r][t] += fault_round_fp16(acc[r][t]);
    }
  }
  acc = total;
}

void main() {
  const uint lane = gl_SubgroupInvocationID;
  const uint group = gl_WorkGroupID.x + gl_WorkGroupID.z * 32768u;
  const uint o0 = group * (LANES * ROWS) + lane;
  const uint t0 = gl_WorkGroupID.y * TILE;
  const uint n_tile = min(uint(TILE), pc.n_tok - t0);
  const uint nb = pc.n_in / 32u;  // blocks of 32 elements per row
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    row[r] = min(o0 + uint(r) * LANES, pc.n_out - 1u);
    [[unroll]] for (int t = 0; t < TILE; ++t) acc[r][t] = 0.0;
  }
#if defined(SPLIT_LAYOUT)
  scale0 = pc.n_out * nb * QW;  // first scale word
#endif
  [[unroll]] for (uint t = 0; t < TILE; ++t)
    xq[t] = (pc.x_off + (t0 + min(t, n_tile - 1u)) * pc.x_stride) / 4u + lane;

  if (FAULT_SPLIT_K > 1u) {
    add_blocks_split_k(nb);
  } else {
    add_blocks(0u, nb);
  }
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    const uint o = o0 + uint(r) * LANES;
    [[unroll]] for (uint t = 0; t < TILE; ++t) {
      if (o < pc.n_out && t < n_tile) {
        const uint yi = pc.y_off + (t0 + t) * pc.y_stride + o;
        const float v = FAULT_FP16_OUT ? fault_round_fp16(acc[r][t]) : acc[r][t];
        y[yi] = pc.accumulate != 0u ? y[yi] + v : v;
      }
    }
  }
}
