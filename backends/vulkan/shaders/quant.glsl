// quant.glsl - weight access for one WTYPE_* (F32, Q4_0, Q4_1, Q8_0).
// Weights are bound as raw 32-bit words (binding W_BINDING, array `wq`); GGUF
// blocks are read in place (no repacking), so unaligned fields are assembled
// from two words. dequant4(row_byte, q) returns elements 4q..4q+3 of a row
// that starts at byte row_byte. Formulas: ggml dequantize_row_*.
#if defined(WTYPE_F32)
#define BLOCK_ELEMS 4u
#define BLOCK_BYTES 16u
#elif defined(WTYPE_Q4_0)
#define BLOCK_ELEMS 32u
#define BLOCK_BYTES 18u
#elif defined(WTYPE_Q4_1)
#define BLOCK_ELEMS 32u
#define BLOCK_BYTES 20u
#elif defined(WTYPE_Q8_0)
#define BLOCK_ELEMS 32u
#define BLOCK_BYTES 34u
#else
#error "define one WTYPE_*"
#endif

layout(std430, binding = W_BINDING) readonly buffer Weights { uint wq[]; };

uint load_u32(uint byte_off) {
  const uint i = byte_off >> 2, s = (byte_off & 3u) * 8u;
  return s == 0u ? wq[i] : ((wq[i] >> s) | (wq[i + 1u] << (32u - s)));
}

float load_f16(uint byte_off) {  // byte_off is even: the half lies in one word
  return unpackHalf2x16((wq[byte_off >> 2] >> ((byte_off & 2u) * 8u)) & 0xFFFFu).x;
}

vec4 nibbles(uint w, uint shift) {
  return vec4(float((w >> shift) & 15u), float((w >> (8u + shift)) & 15u),
              float((w >> (16u + shift)) & 15u), float((w >> (24u + shift)) & 15u));
}

vec4 dequant4(uint row_byte, uint q) {
#if defined(WTYPE_F32)
  const uint i = (row_byte >> 2) + 4u * q;
  return vec4(uintBitsToFloat(wq[i]), uintBitsToFloat(wq[i + 1u]), uintBitsToFloat(wq[i + 2u]),
              uintBitsToFloat(wq[i + 3u]));
#else
  const uint b = row_byte + (q >> 3) * BLOCK_BYTES;  // 8 quads per 32-element block
  const uint j = q & 7u;
#if defined(WTYPE_Q4_0)
  const float d = load_f16(b);
  return (nibbles(load_u32(b + 2u + 4u * (j & 3u)), j >= 4u ? 4u : 0u) - 8.0) * d;
#elif defined(WTYPE_Q4_1)
  const vec2 dm = unpackHalf2x16(wq[b >> 2]);
  return nibbles(wq[(b >> 2) + 1u + (j & 3u)], j >= 4u ? 4u : 0u) * dm.x + dm.y;
#elif defined(WTYPE_Q8_0)
  const float d = load_f16(b);
  const int w = int(load_u32(b + 2u + 4u * j));
  return vec4(float(bitfieldExtract(w, 0, 8)), float(bitfieldExtract(w, 8, 8)),
              float(bitfieldExtract(w, 16, 8)), float(bitfieldExtract(w, 24, 8))) * d;
#endif
#endif
}

// Bytes of one row of n elements.
uint row_bytes(uint n) { return n / BLOCK_ELEMS * BLOCK_BYTES; }
