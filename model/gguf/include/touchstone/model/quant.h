// touchstone/model/quant.h - ggml tensor types: sizes, block layouts, dequantization.
//
// Block layouts are copied from ggml/src/ggml-common.h and the formulas from
// dequantize_row_* in ggml/src/ggml-quants.c; the reference implementation
// must reproduce ggml's numbers bit for bit (same operation order, fp32
// arithmetic). Multi-byte fields are little-endian, as in GGUF files.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "touchstone/model/gguf.h"

namespace touchstone::gguf {

struct TypeTraits {
  const char* name;     // "Q4_1"
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
  bool quantized;
};

/// Traits of a known ggml type. Throws Error for unknown/removed type numbers.
const TypeTraits& type_traits(TensorType t);
/// nullptr for unknown/removed type numbers.
const TypeTraits* find_type_traits(TensorType t);
/// "Q4_1", or "type#N" for unknown types (that view lives in a small
/// thread-local ring buffer: copy it if it must outlive 4 further calls).
std::string_view type_name(TensorType t);
/// True when dequantize_row() implements `t`.
bool can_dequantize(TensorType t);

// ---- scalar conversions (exact, IEEE-754 binary16 / bfloat16) ---------------
float fp16_to_fp32(uint16_t h);
float bf16_to_fp32(uint16_t h);
/// Round-to-nearest-even; overflow gives +-inf, NaN stays NaN.
uint16_t fp32_to_fp16(float f);

// ---- block layouts (ggml-common.h) -----------------------------------------
inline constexpr int QK4_0 = 32;
inline constexpr int QK4_1 = 32;
inline constexpr int QK5_0 = 32;
inline constexpr int QK5_1 = 32;
inline constexpr int QK8_0 = 32;
inline constexpr int QK8_1 = 32;
inline constexpr int QK_K = 256;
inline constexpr int K_SCALE_SIZE = 12;

using ggml_half = uint16_t;  // IEEE binary16 bits

struct block_q4_0 {
  ggml_half d;            // delta
  uint8_t qs[QK4_0 / 2];  // nibbles / quants
};
static_assert(sizeof(block_q4_0) == sizeof(ggml_half) + QK4_0 / 2, "wrong q4_0 block size/padding");

struct block_q4_1 {
  ggml_half d;            // delta
  ggml_half m;            // min
  uint8_t qs[QK4_1 / 2];  // nibbles / quants
};
static_assert(sizeof(block_q4_1) == 2 * sizeof(ggml_half) + QK4_1 / 2,
              "wrong q4_1 block size/padding");

struct block_q5_0 {
  ggml_half d;            // delta
  uint8_t qh[4];          // 5-th bit of quants
  uint8_t qs[QK5_0 / 2];  // nibbles / quants
};
static_assert(sizeof(block_q5_0) == sizeof(ggml_half) + sizeof(uint32_t) + QK5_0 / 2,
              "wrong q5_0 block size/padding");

struct block_q5_1 {
  ggml_half d;            // delta
  ggml_half m;            // min
  uint8_t qh[4];          // 5-th bit of quants
  uint8_t qs[QK5_1 / 2];  // nibbles / quants
};
static_assert(sizeof(block_q5_1) == 2 * sizeof(ggml_half) + sizeof(uint32_t) + QK5_1 / 2,
              "wrong q5_1 block size/padding");

struct block_q8_0 {
  ggml_half d;       // delta
  int8_t qs[QK8_0];  // quants
};
static_assert(sizeof(block_q8_0) == sizeof(ggml_half) + QK8_0, "wrong q8_0 block size/padding");

struct block_q8_1 {
  ggml_half d;       // delta
  ggml_half s;       // d * sum(qs[i])
  int8_t qs[QK8_1];  // quants
};
static_assert(sizeof(block_q8_1) == 2 * sizeof(ggml_half) + QK8_1, "wrong q8_1 block size/padding");

// 2-bit: 16 blocks of 16 elements, weight = a*q + b, 4-bit scales and mins.
struct block_q2_K {
  uint8_t scales[QK_K / 16];  // scales and mins, quantized with 4 bits
  uint8_t qs[QK_K / 4];       // quants
  ggml_half d;                // super-block scale for quantized scales
  ggml_half dmin;             // super-block scale for quantized mins
};
static_assert(sizeof(block_q2_K) == 2 * sizeof(ggml_half) + QK_K / 16 + QK_K / 4,
              "wrong q2_K block size/padding");

// 3-bit: 16 blocks of 16 elements, weight = a*q, 6-bit scales.
struct block_q3_K {
  uint8_t hmask[QK_K / 8];  // quants - high bit
  uint8_t qs[QK_K / 4];     // quants - low 2 bits
  uint8_t scales[12];       // scales, quantized with 6 bits
  ggml_half d;              // super-block scale
};
static_assert(sizeof(block_q3_K) == sizeof(ggml_half) + QK_K / 4 + QK_K / 8 + 12,
              "wrong q3_K block size/padding");

// 4-bit: 8 blocks of 32 elements, weight = a*q + b, 6-bit scales and mins.
struct block_q4_K {
  ggml_half d;                   // super-block scale for quantized scales
  ggml_half dmin;                // super-block scale for quantized mins
  uint8_t scales[K_SCALE_SIZE];  // scales and mins, quantized with 6 bits
  uint8_t qs[QK_K / 2];          // 4-bit quants
};
static_assert(sizeof(block_q4_K) == 2 * sizeof(ggml_half) + K_SCALE_SIZE + QK_K / 2,
              "wrong q4_K block size/padding");

// 5-bit: 8 blocks of 32 elements, weight = a*q + b, 6-bit scales and mins.
struct block_q5_K {
  ggml_half d;                   // super-block scale for quantized scales
  ggml_half dmin;                // super-block scale for quantized mins
  uint8_t scales[K_SCALE_SIZE];  // scales and mins, quantized with 6 bits
  uint8_t qh[QK_K / 8];          // quants, high bit
  uint8_t qs[QK_K / 2];          // quants, low 4 bits
};
static_assert(sizeof(block_q5_K) == 2 * sizeof(ggml_half) + K_SCALE_SIZE + QK_K / 2 + QK_K / 8,
              "wrong q5_K block size/padding");

// 6-bit: 16 blocks of 16 elements, weight = a*q, 8-bit scales.
struct block_q6_K {
  uint8_t ql[QK_K / 2];      // quants, lower 4 bits
  uint8_t qh[QK_K / 4];      // quants, upper 2 bits
  int8_t scales[QK_K / 16];  // scales, quantized with 8 bits
  ggml_half d;               // super-block scale
};
static_assert(sizeof(block_q6_K) == sizeof(ggml_half) + QK_K / 16 + 3 * QK_K / 4,
              "wrong q6_K block size/padding");

// Intermediate quantization (dot products only): float d, 8-bit quants, block sums.
struct block_q8_K {
  float d;                   // delta
  int8_t qs[QK_K];           // quants
  int16_t bsums[QK_K / 16];  // sum of quants in groups of 16
};
static_assert(sizeof(block_q8_K) == sizeof(float) + QK_K + QK_K / 16 * sizeof(int16_t),
              "wrong q8_K block size/padding");

// MXFP4 (OCP Microscaling Formats v1.0; ggml GGML_TYPE_MXFP4, the experts of gpt-oss):
// 32 fp4 (e2m1) values sharing one e8m0 scale. qs[j] holds element j in its low nibble
// and element j + 16 in its high nibble (ggml-common.h block_mxfp4).
inline constexpr int QK_MXFP4 = 32;

struct block_mxfp4 {
  uint8_t e;                 // E8M0 scale exponent
  uint8_t qs[QK_MXFP4 / 2];  // e2m1 codes, two per byte
};
static_assert(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "wrong mxfp4 block size/padding");

// ggml-common.h kvalues_mxfp4: the 16 e2m1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
// their negatives, times 2); the scale below is halved to match.
inline constexpr int8_t kvalues_mxfp4[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                             0, -1, -2, -3, -4, -6, -8, -12};

/// ggml-impl.h ggml_e8m0_to_fp32_half: 2^(x - 128) as an fp32 (x < 2: the subnormals
/// 2^-128 and 2^-127), exact for every x.
float e8m0_to_fp32_half(uint8_t x);

// ---- dequantization ---------------------------------------------------------
/// Dequantizes `n` consecutive elements (n % block_size == 0, else Error).
/// `src` holds n / block_size * type_size bytes; no alignment is required.
/// Supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K MXFP4.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);

/// Whole tensor to fp32, row-major in ggml order (shape[0] fastest).
std::vector<float> dequantize(const File& f, const TensorInfo& t);

}  // namespace touchstone::gguf
