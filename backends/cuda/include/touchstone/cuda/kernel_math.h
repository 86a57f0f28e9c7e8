// touchstone/cuda/kernel_math.h - the per-element / per-block math of the CUDA
// backend's kernels, as __host__ __device__ inline functions.
//
// Every kernel in backends/cuda/src/kernels.cu computes its numbers through the
// functions below, and this header also compiles with g++ (no CUDA), so the
// maths is unit-tested on the host (backends/cuda/tests/kernel_math_test.cpp)
// against touchstone::gguf::dequantize_row and the reference formulas of
// reference/transformer/src/reference_forward.cpp, on machines without a GPU.
//
// Rounding: nvcc contracts a*b+c into an FMA by default, g++ in ISO mode does
// not. Wherever the result must be bit-identical to the reference (block
// dequantization, RoPE rotation) the operations go through mul_rn/add_rn/...
// (__fmul_rn & co. on the device: never contracted); wherever an FMA is
// wanted (dot products) it is written explicitly as fma_rn, which is
// correctly rounded on both sides. Host and device therefore produce the same
// bits for the functions documented as "exact"; exp/expf are the only
// functions whose last ulp may differ between glibc and CUDA's libdevice.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TS_HD __host__ __device__ __forceinline__
#else
#define TS_HD inline
#endif

namespace touchstone::cuda_math {

// ---- IEEE operations, never contracted ---------------------------------------
TS_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TS_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TS_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TS_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
TS_HD double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TS_HD double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TS_HD double dsub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
TS_HD float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
TS_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

// ---- ggml block layouts (ggml-common.h; identical to touchstone/model/quant.h,
// static_assert'ed in the host tests). fp16 fields are raw binary16 bits. ------
inline constexpr int kQK = 32;     // Q4_0 / Q4_1 / Q8_0 block, and the "chunk" of every type
inline constexpr int kQK_K = 256;  // K-quant super-block

struct blk_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct blk_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct blk_q5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j: the 5th bit of element j
  uint8_t qs[16];
};
struct blk_q8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct blk_q4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct blk_q6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(blk_q4_0) == 18 && sizeof(blk_q4_1) == 20 && sizeof(blk_q8_0) == 34);
static_assert(sizeof(blk_q5_0) == 22);
static_assert(sizeof(blk_q4_K) == 144 && sizeof(blk_q6_K) == 210);

// Weight types the device kernels read (values = ggml_type numbers).
enum class WType : int {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14
};

// IEEE binary16 -> fp32, exact (same bits as touchstone::gguf::fp16_to_fp32).
TS_HD float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float v = mul_rn(static_cast<float>(mant), 5.9604644775390625e-08f);  // 2^-24, exact
    return sign ? -v : v;
  }
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000u | (mant << 13));
  return bits_to_float(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

// fp32 -> IEEE binary16 bits, round to nearest even; overflow to inf, NaN stays
// a quiet NaN (same bits as touchstone::gguf::fp32_to_fp16).
TS_HD uint16_t fp32_to_fp16(float f) {
  uint32_t x = float_to_bits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7C00u |
                                 (x > 0x7F800000u ? 0x200u | ((x >> 13) & 0x3FFu) : 0u));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (x < 0x38800000u) {                                               // below 2^-14: subnormal
    if (x < 0x33000000u) return sign;                                  // < 2^-25: 0
    const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - (x >> 23);  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t r = x - 0x38000000u;  // rebias exponent 127 -> 15
  return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}
// x rounded to the nearest fp16 value and back (the fp16_accumulation fault and
// the fp16-staged partial sums of the split-K reduction faults).
TS_HD float round_fp16(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

// ---- dequantization of one element (exact: same bits as dequantize_row) -------
// `j` is the element index inside the block (0..31, or 0..255 for K-quants).
TS_HD float deq_q4_0(const blk_q4_0& b, int j) {
  const int q = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
  return mul_rn(static_cast<float>(q - 8), fp16_to_fp32(b.d));
}
TS_HD float deq_q4_1(const blk_q4_1& b, int j) {
  const int q = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
  return add_rn(mul_rn(static_cast<float>(q), fp16_to_fp32(b.d)), fp16_to_fp32(b.m));
}
// Q5_0: element j = (4-bit quant | bit j of qh << 4) - 16, times d (ggml
// dequantize_row_q5_0: low nibbles are elements 0..15, high nibbles 16..31).
TS_HD float deq_q5_0(const blk_q5_0& b, int j) {
  uint32_t qh;
  memcpy(&qh, b.qh, sizeof qh);
  const int lo = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
  const int q = (lo | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
  return mul_rn(static_cast<float>(q), fp16_to_fp32(b.d));
}
TS_HD float deq_q8_0(const blk_q8_0& b, int j) {
  return mul_rn(static_cast<float>(b.qs[j]), fp16_to_fp32(b.d));
}
// ggml get_scale_min_k4: pair j (0..7) of 6-bit (scale, min) packed in 12 bytes.
TS_HD void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}
TS_HD float deq_q4_K(const blk_q4_K& b, int j) {
  const int chunk = j / 64, w = j % 64, hi = w >= 32 ? 1 : 0;
  int sc = 0, m = 0;
  scale_min_k4(2 * chunk + hi, b.scales, &sc, &m);
  const float dl = mul_rn(fp16_to_fp32(b.d), static_cast<float>(sc));
  const float ml = mul_rn(fp16_to_fp32(b.dmin), static_cast<float>(m));
  const uint8_t byte = b.qs[chunk * 32 + (w % 32)];
  const int q = hi ? (byte >> 4) : (byte & 0xF);
  return sub_rn(mul_rn(dl, static_cast<float>(q)), ml);
}
TS_HD float deq_q6_K(const blk_q6_K& b, int j) {
  const int n = j / 128, r = j % 128, g = r / 32, l = r % 32, is = l / 16;
  const uint8_t* ql = b.ql + 64 * n;
  const uint8_t* qh = b.qh + 32 * n;
  const int8_t* sc = b.scales + 8 * n;
  const int lo = (g & 1) ? ql[l + 32] : ql[l];
  const int nib = (g & 2) ? (lo >> 4) : (lo & 0xF);
  const int q = static_cast<int8_t>(nib | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
  return mul_rn(mul_rn(fp16_to_fp32(b.d), static_cast<float>(sc[is + 2 * g])),
                static_cast<float>(q));
}

// Element `i` of a row of `type` starting at `row` (row = first byte of the row).
TS_HD float deq_elem(WType type, const void* row, int64_t i) {
  switch (type) {
    case WType::F32:
      return static_cast<const float*>(row)[i];
    case WType::F16:
      return fp16_to_fp32(static_cast<const uint16_t*>(row)[i]);
    case WType::Q4_0:
      return deq_q4_0(static_cast<const blk_q4_0*>(row)[i / 32], static_cast<int>(i % 32));
    case WType::Q4_1:
      return deq_q4_1(static_cast<const blk_q4_1*>(row)[i / 32], static_cast<int>(i % 32));
    case WType::Q5_0:
      return deq_q5_0(static_cast<const blk_q5_0*>(row)[i / 32], static_cast<int>(i % 32));
    case WType::Q8_0:
      return deq_q8_0(static_cast<const blk_q8_0*>(row)[i / 32], static_cast<int>(i % 32));
    case WType::Q4_K:
      return deq_q4_K(static_cast<const blk_q4_K*>(row)[i / 256], static_cast<int>(i % 256));
    case WType::Q6_K:
      return deq_q6_K(static_cast<const blk_q6_K*>(row)[i / 256], static_cast<int>(i % 256));
  }
  return 0.0f;
}

// Bytes of one row of n elements (n a multiple of the block size).
TS_HD int64_t row_bytes(WType type, int64_t n) {
  switch (type) {
    case WType::F32:
      return 4 * n;
    case WType::F16:
      return 2 * n;
    case WType::Q4_0:
      return n / 32 * 18;
    case WType::Q4_1:
      return n / 32 * 20;
    case WType::Q5_0:
      return n / 32 * 22;
    case WType::Q8_0:
      return n / 32 * 34;
    case WType::Q4_K:
      return n / 256 * 144;
    case WType::Q6_K:
      return n / 256 * 210;
  }
  return 0;
}

// ---- the quantized-only faults (touchstone/model/faults.h), applied to the blocks --------
// quant_scale_min_swap and nibble_order are bugs in a kernel's block decoding; the
// backend uploads blocks corrupted so that the correct kernels read them as the
// buggy kernel would (as cpu_simd's Session::corrupt_quantized_copy). Host only.
struct Q4Layout {
  int64_t block_bytes;  // bytes per block
  int64_t qs;           // offset of the first 4-bit quant byte
  bool has_min;         // fp16 m (Q4_1) / dmin (Q4_K) at bytes 2..3
};
// The layout of a type with 4-bit quants (Q4_0, Q4_1, Q4_K); false for the others.
inline bool q4_layout(WType t, Q4Layout* out) {
  switch (t) {
    case WType::Q4_0:
      *out = {static_cast<int64_t>(sizeof(blk_q4_0)), 2, false};
      return true;
    case WType::Q4_1:
      *out = {static_cast<int64_t>(sizeof(blk_q4_1)), 4, true};
      return true;
    case WType::Q4_K:
      *out = {static_cast<int64_t>(sizeof(blk_q4_K)), 16, true};
      return true;
    default:
      return false;
  }
}
// One block as the buggy kernel reads it: swap_scale_min swaps the fp16 d and
// m / dmin (bytes 0..1 and 2..3); otherwise each quant byte's low and high
// nibbles are swapped (nibble_order).
inline void corrupt_q4_block(uint8_t* blk, const Q4Layout& lay, bool swap_scale_min) {
  if (swap_scale_min) {
    const uint8_t b0 = blk[0], b1 = blk[1];
    blk[0] = blk[2], blk[1] = blk[3], blk[2] = b0, blk[3] = b1;
    return;
  }
  for (int64_t i = lay.qs; i < lay.block_bytes; ++i)
    blk[i] = static_cast<uint8_t>((blk[i] >> 4) | (blk[i] << 4));
}

// ---- dot-product order of the matrix-vector kernel ---------------------------
// A row of length n is cut into chunks of 32 consecutive elements (a Q4_0/Q4_1/
// Q8_0 block, a K-quant sub-block, or 32 floats). Lane L of a warp (32 lanes)
// takes chunks L, L+32, L+64, ... in increasing order and accumulates
// acc = fma(w_i, x_i, acc) over the chunk's elements in increasing i (fp32).
// The 32 lane sums are then combined by the xor butterfly below.
TS_HD float chunk_dot(WType type, const void* row, int64_t chunk, const float* x, float acc) {
  const int64_t i0 = chunk * kQK;
  for (int j = 0; j < kQK; ++j) acc = fma_rn(deq_elem(type, row, i0 + j), x[i0 + j], acc);
  return acc;
}

// One butterfly step: lane i gets v[i] + v[i ^ offset]. After offsets
// 16, 8, 4, 2, 1 every lane holds the same sum (fp32 + is commutative, so the
// partner computes the identical value). Device: __shfl_xor_sync.
inline constexpr int kWarp = 32;
TS_HD void butterfly_step(float* v, int offset) {
  float t[kWarp];
  for (int i = 0; i < kWarp; ++i) t[i] = add_rn(v[i], v[i ^ offset]);
  for (int i = 0; i < kWarp; ++i) v[i] = t[i];
}
// Host emulation of the warp reduction of 32 lane values (device order).
TS_HD float warp_sum_emulated(const float* lanes) {
  float v[kWarp];
  for (int i = 0; i < kWarp; ++i) v[i] = lanes[i];
  for (int off = kWarp / 2; off > 0; off /= 2) butterfly_step(v, off);
  return v[0];
}
// Host emulation of the whole warp dot product of the matvec kernel.
TS_HD float row_dot_emulated(WType type, const void* row, const float* x, int64_t n) {
  float lanes[kWarp];
  const int64_t n_chunks = n / kQK;
  for (int l = 0; l < kWarp; ++l) {
    float acc = 0.0f;
    for (int64_t c = l; c < n_chunks; c += kWarp) acc = chunk_dot(type, row, c, x, acc);
    lanes[l] = acc;
  }
  return warp_sum_emulated(lanes);
}

// ---- RoPE (touchstone/model/scalar_ops.h: ops::rope_interleaved / ops::rope_neox) ---------
// The angle table is built on the host with exactly the reference formula (fp64
// pow/cos/sin) and uploaded; the rotation itself is done in fp64 and rounded
// once, so a rotated pair is bit-identical to the reference.
// theta = pos / scale * base^(-2i / n_rot) / freq_factor (ops::rope_theta; scale:
// linear RoPE scaling, freq_factor: rope_freqs.weight[i], 1 = none).
inline double rope_theta(int32_t pos, int64_t i, int64_t n_rot, double base, double scale,
                         double freq_factor) {
  return static_cast<double>(pos) / scale *
         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot)) / freq_factor;
}
// The two elements of a head vector that rotary pair i (< n_rot / 2) rotates:
// (i, i + n_rot/2) for NeoX, (2i, 2i+1) for interleaved; elements >= n_rot
// (partial rotary) are never touched.
TS_HD void rope_pair(int i, int n_rot, bool neox, int* a, int* b) {
  *a = neox ? i : 2 * i;
  *b = neox ? i + n_rot / 2 : 2 * i + 1;
}
TS_HD void rope_rotate(float* x0, float* x1, double c, double s) {
  const double a = *x0, b = *x1;
  *x0 = static_cast<float>(dsub_rn(dmul_rn(a, c), dmul_rn(b, s)));
  *x1 = static_cast<float>(dadd_rn(dmul_rn(a, s), dmul_rn(b, c)));
}

// ---- online softmax -----------------------------------------------------------
// A partial softmax over a set of scores is (m, l, acc): m = max score,
// l = sum exp(s - m), acc = sum exp(s - m) v. Empty set: (-inf, 0, 0).
// merge((m1,l1,a1), (m2,l2,a2)) = (m, l1 c1 + l2 c2, a1 c1 + a2 c2) with
// m = max(m1, m2), c_k = exp(m_k - m) (0 for an empty side). Adding one score
// s with value row v is merge(state, (s, 1, v)). The attention kernel folds
// KV positions into per-warp states, warps in order 0..3 into a split state,
// splits in order 0..S-1 into the final state; output = acc / l.
struct SoftmaxScales {
  float m, c1, c2;
};
TS_HD float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
TS_HD SoftmaxScales softmax_merge_scales(float m1, float m2) {
  const float m = m1 > m2 ? m1 : m2;
  if (m == -INFINITY) return {m, 0.0f, 0.0f};
  const float c1 = m1 == -INFINITY ? 0.0f : exp_f(m1 - m);
  const float c2 = m2 == -INFINITY ? 0.0f : exp_f(m2 - m);
  return {m, c1, c2};
}
// In place: (m1, l1, a1[0..n)) <- merge((m1, l1, a1), (m2, l2, a2)).
TS_HD void softmax_merge(float* m1, float* l1, float* a1, float m2, float l2, const float* a2,
                         int n) {
  const SoftmaxScales s = softmax_merge_scales(*m1, m2);
  *m1 = s.m;
  *l1 = fma_rn(l2, s.c2, mul_rn(*l1, s.c1));
  for (int i = 0; i < n; ++i) a1[i] = fma_rn(a2[i], s.c2, mul_rn(a1[i], s.c1));
}

// The softmax_no_max fault: score s adds (0, e, e v) with e = expf(s) in fp32 and
// no max subtracted (ops: exp(float(score)); inf once s > ~88.7, then NaN).
// a2 is scratch of n floats (overwritten with e v).
TS_HD void softmax_add_no_max(float* m1, float* l1, float* a1, float s, const float* v, float* a2,
                              int n) {
  const float e = exp_f(s);
  for (int i = 0; i < n; ++i) a2[i] = mul_rn(e, v[i]);
  softmax_merge(m1, l1, a1, 0.0f, e, a2, n);
}

// KV positions [t0, t1) that the query at `pos` attends (reference_forward.cpp,
// ReferenceTransformer::attention): causal [0, pos]; a sliding window W > 0
// keeps the last W (t0 = pos - W + 1). Faults: drop_newest (kv_position_off_by_one)
// ends at pos for pos > 0; kv_floor (rewind_noop: the session's high-water mark,
// else 0) extends t1 to it; whole_chunk (causal_mask) extends t1 to chunk_end,
// the end of the prefill chunk.
struct KvRange {
  int t0, t1;
};
TS_HD KvRange attention_range(int pos, int chunk_end, int kv_floor, int window, bool drop_newest,
                              bool whole_chunk) {
  int t1 = (drop_newest && pos > 0) ? pos : pos + 1;
  if (t1 < kv_floor) t1 = kv_floor;
  if (whole_chunk && t1 < chunk_end) t1 = chunk_end;
  const int t0 = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
  return {t0, t1};
}

// ---- elementwise (fp64, rounded once: the reference formulas) ---------------
TS_HD float silu_mul(float g, float u) {
  const double gd = g;
#if defined(__CUDA_ARCH__)
  const double e = exp(-gd);
#else
  const double e = std::exp(-gd);
#endif
  return static_cast<float>(dmul_rn(gd / dadd_rn(1.0, e), static_cast<double>(u)));
}
TS_HD double tanh_d(double x) {
#if defined(__CUDA_ARCH__)
  return tanh(x);
#else
  return std::tanh(x);
#endif
}
// GeGLU: gelu_tanh(g) * u (ops::gelu_tanh:
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), fp64, same operation order).
TS_HD float gelu_mul(float g, float u) {
  constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
  const double x = g;
  const double cube = dmul_rn(dmul_rn(dmul_rn(0.044715, x), x), x);
  const double t = tanh_d(dmul_rn(kSqrt2OverPi, dadd_rn(x, cube)));
  const double act = dmul_rn(dmul_rn(0.5, x), dadd_rn(1.0, t));
  return static_cast<float>(dmul_rn(act, static_cast<double>(u)));
}
// Final logit soft-capping: cap * tanh(x / cap) in fp64 (ops::softcap).
TS_HD float softcap(float x, double cap) {
  return static_cast<float>(dmul_rn(cap, tanh_d(static_cast<double>(x) / cap)));
}
// Embedding element times the model's embedding scale, fp64, rounded once.
TS_HD float embd_scaled(float e, double scale) {
  return static_cast<float>(dmul_rn(static_cast<double>(e), scale));
}
// RMSNorm output element: x * inv * w in fp64 (inv = 1 / sqrt(mean(x^2) + eps)).
TS_HD float rms_scale(float x, double inv, float w) {
  return static_cast<float>(dmul_rn(dmul_rn(static_cast<double>(x), inv), static_cast<double>(w)));
}
TS_HD double rms_inv(double sum_sq, int64_t n, double eps) {
  return 1.0 / sqrt(sum_sq / static_cast<double>(n) + eps);
}
TS_HD float residual_add(float x, float y) {
  return static_cast<float>(dadd_rn(static_cast<double>(x), static_cast<double>(y)));
}

// ---- greedy argmax: (value desc, id asc); NaN never wins ------------------------
struct ArgMax {
  float v;
  int32_t id;  // -1: none yet (or only NaN)
};
TS_HD ArgMax argmax_merge(ArgMax a, ArgMax b) {
  if (b.id < 0) return a;
  if (a.id < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.id < a.id)) return b;
  return a;
}
TS_HD ArgMax argmax_leaf(float v, int32_t id) { return v != v ? ArgMax{0.0f, -1} : ArgMax{v, id}; }

}  // namespace touchstone::cuda_math
