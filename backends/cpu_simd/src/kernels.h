// kernels.h - the compute kernels of the cpu_simd backend.
//
// Two families, both selected at run time for the CPU we run on:
//  * fp32 (dot, matrix-vector rows, axpy): Highway 1.0.3 (foreach_target +
//    HWY_DYNAMIC_DISPATCH), compiled for every x86 target Highway attains
//    (SSE2/SSSE3/SSE4/AVX2/AVX-512 "AVX3") plus a portable EMU128/scalar one.
//  * quantized (Q4_0/Q4_1/Q8_0 weight blocks x int8 activation blocks):
//    hand-written intrinsics, because Highway 1.0.3 has no u8 x s8 dot product
//    (SumOfMulQuadAccumulate arrived in Highway 1.2). Levels: scalar (portable),
//    AVX2 (vpmaddubsw), AVX-512 VNNI (vpdpbusd, two blocks per 512-bit register).
//    The level is detected with __builtin_cpu_supports and can be forced (tests).
//
// Numerics. fp32 kernels accumulate in fp32 (vector lanes, then a fixed
// pairwise reduction), so the result for one output element never depends on
// the thread count or on which other rows/tokens are computed in the same call.
// Quantized kernels: exact int32 block dot products, then fp32 scale/accumulate
// per lane in block order; same independence property.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::cpu_simd {

// ---------------- fp32 (Highway) ----------------
float dot_f32(const float* a, const float* b, size_t n);
// y[r] = dot(W + r*ld, x, n) for r in [0, n_rows)
void matvec_f32(const float* W, size_t ld, const float* x, float* y, size_t n_rows, size_t n);
// y += a * x
void axpy_f32(float a, const float* x, float* y, size_t n);
// y *= a
void scale_f32(float a, float* y, size_t n);

// Gated FFN activation, in place: g[i] = fp32(act(g[i]) * u[i]) computed in fp64
// (x = double(g[i]), rounded to fp32 once), act one of
//   tanh-GELU (HF gelu_pytorch_tanh): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   SiLU (SwiGLU):                   x / (1 + exp(-x))
// with the operations in the reference's order (touchstone::ops::gelu_tanh /
// silu) except that tanh and exp are Highway's fp64 vector Tanh / Exp
// (hwy/contrib/math: max error 4 / 1 ulp in fp64) for |x| < 500 and std::tanh /
// std::exp otherwise. An fp32 result therefore differs from the reference's
// only when the fp64 value lies within a few fp64 ulp of an fp32 rounding
// boundary (~1e-8 of elements, by 1 fp32 ulp). Deterministic per element:
// independent of n, of the slice an element falls in and of threads.
void gated_act_f64(bool gelu, float* g, const float* u, size_t n);
// Causal softmax attention of one query head q[hd] over n_kv >= 1 cached
// positions: K row t at K + t*ld, V row t at V + t*ld (the KV cache layout,
// ld = n_head_kv * head_dim), scores[n_kv] is scratch. In fp32:
//   s_t = dot_f32(q, K_t) * scale;  m = max(sink, max_t s_t);
//   p_t = exp(s_t - m)  (Highway's vector Exp, hwy/contrib/math: max error 1 ulp);
//   any NaN score: out is all NaN (as with std::exp, which propagates it);
//   sum = lane-wise sum over t (N lanes, t in order per lane) then SumOfLanes,
//         then + std::exp(sink - m) (an attention sink, gpt-oss: a logit that joins
//         the softmax and attends to nothing; sink = -inf, the default: no term);
//   out[j] = (p_0 V_0j + p_1 V_1j + ...) * (1 / sum)  (one FMA per t, in t order).
// The result depends on the Highway target (N), never on threads or on n_kv's
// split into calls.
void attend_f32(const float* q, const float* K, const float* V, size_t ld, size_t hd, size_t n_kv,
                float scale, float* scores, float* out, float sink = -HUGE_VALF);
// G queries over the same K / V rows (the query heads of one GQA group, for
// one or several tokens): query g (q[g], out[g]) attends rows [t0[g], t1[g])
// (t0 < t1) of K and V, with scores scratch at scores + g * ld_scores
// (ld_scores >= t1[g] - t0[g]). out[g] is bitwise attend_f32(q[g],
// K + t0[g]*ld, V + t0[g]*ld, ld, hd, t1[g] - t0[g], ...): per query the same
// operations in the same order. Queries are taken in register tiles (4 with
// AVX-512, a remainder of 3 or 2 as one tile; else 2) whose common rows are
// loaded once for the tile, so the tile's independent dot-product and FMA
// chains overlap; rows a query does not share are visited alone, in order.
// sinks: query g's sink logit at sinks[g] (attend_f32's sink), or nullptr for none.
void attend_multi_f32(size_t G, const float* const* q, const float* K, const float* V, size_t ld,
                      size_t hd, const size_t* t0, const size_t* t1, float scale, float* scores,
                      size_t ld_scores, float* const* out, const float* sinks = nullptr);

// Highway targets compiled into this library and supported by this CPU
// (bit, name), best first; force_hwy_target(0) restores the default (the
// TOUCHSTONE_CPU_SIMD_TARGET one when set, see select_isa_from_env).
std::vector<std::pair<int64_t, std::string>> hwy_targets();
void force_hwy_target(int64_t target);
std::string hwy_current_target();

// ---------------- ISA selection (TOUCHSTONE_CPU_SIMD_TARGET) ----------------
// Every Highway target compiled into this library, best first, and whether
// this CPU can run it (what the CPU reports, whatever is forced).
struct IsaTarget {
  int64_t bit;
  std::string name;  // hwy::TargetName: AVX3, AVX2, SSE4, SSSE3, EMU128, ...
  bool runnable;
};
std::vector<IsaTarget> compiled_hwy_targets();

enum class QLevel : int;
// The int8 kernel level a Highway target guarantees: AVX3_DL -> AVX512VNNI
// (VNNI is part of it); AVX3 (AVX-512 F/BW/DQ/VL, no VNNI) and AVX2 -> AVX2;
// SSE4, SSSE3, EMU128 -> Scalar.
QLevel qlevel_cap(int64_t hwy_target);

// TOUCHSTONE_CPU_SIMD_TARGET=<name> (case-insensitive hwy::TargetName),
// applied once per process (later calls return the first result): Highway
// dispatch is restricted to that target and the int8 level capped at
// qlevel_cap(target). Unset or empty: every target, the best one dispatched.
// A name not compiled in, or one this CPU cannot run, changes nothing and is
// reported (message names it and lists the compiled / runnable targets).
struct IsaSelection {
  enum Status { Ok, NotCompiled, NotRunnable } status = Ok;
  std::string forced;   // the target name when one was forced, else empty
  std::string message;  // the error when status != Ok
};
const IsaSelection& select_isa_from_env();

// ---------------- int8 activations ----------------
// A row of n (multiple of 32) activations quantized per 32-block, symmetric:
//   d[b] = max|x| / 127,  qs[i] = round_half_even(x[i] * (1 / d[b])) in [-127, 127],
//   s[b] = d[b] * sum(qs of block b)   (for the Q4_1 min term, as llama.cpp's Q8_1)
// Scales are kept in fp32 (llama.cpp's block_q8_1 rounds d and s to fp16).
struct ActRow {
  int8_t* qs;
  float* d;
  float* s;
};
void quantize_act(const float* x, size_t n, ActRow out);

// ---------------- quantized matmul ----------------
enum class QType : int { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };
size_t qtype_block_bytes(QType t);

// Y[t * ldy + r] = sum_b  W_r,b . X_t,b  for rows r in [r0, r1), tokens t in [0, n_tok).
// W: row-major GGUF blocks, row r at W + r * row_bytes, nb blocks per row.
// X: n_tok activation rows (quantize_act), nb blocks each.
void gemm_q(QType type, const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
            const ActRow* X, size_t n_tok, float* Y, size_t ldy);

// int8 activations x GGUF blocks in a row-interleaved layout
// (kernels_quant_r16.cpp, kernels_quant_r16k.cpp), AVX-512 VNNI only (qlevel()
// == AVX512VNNI; the caller checks), for ggml types Q4_0 (2), Q4_1 (3), Q5_0
// (6), Q8_0 (8), Q4_K (12) and Q6_K (14) (r16_type): rows in groups of 16, one
// record per group and block (K-quants: per 256-element super-block). nb
// counts 32-element blocks (n_in / 32; a multiple of 8 for the K-quants).
// repack_r16 writes rows [0, n_rows) (n_rows % 16 == 0) of a GGUF matrix (row r
// at W + r * row_bytes) into dst (r16_bytes(t, n_rows, nb) bytes). gemm_q_r16:
// Y[t * ldy + r] for rows r in [r0, r1) (multiples of 16) and tokens t < n_tok;
// per output, 32-element blocks in order, with the exact int32 block sum
// isum_b of the stored unsigned quants: acc = fma(isum_b, fl(d_w d_a), acc),
// macc = fma(c_w, s_a, macc), y = acc + macc, c_w = m_w (Q4_1), -8 d_w (Q4_0),
// -16 d_w (Q5_0), -128 d_w (Q8_0, stored + 128), -dmin m_b (Q4_K, d_w = d
// sc_b); Q6_K: two terms per block, one per 16-element half with its scale
// (isum_h = sum u a - 32 sum a), no macc (kernels_quant_r16k.cpp). One
// output's bits do not depend on the row range or on the token count.
bool r16_type(int ggml_type);
size_t r16_bytes(int ggml_type, size_t n_rows, size_t nb);
void repack_r16(int ggml_type, const uint8_t* W, size_t row_bytes, size_t nb, size_t n_rows,
                uint8_t* dst);
void gemm_q_r16(int ggml_type, const uint8_t* R, size_t nb, size_t r0, size_t r1, const ActRow* X,
                size_t n_tok, float* Y, size_t ldy);

// Same contract with fp32 activations X (n_tok rows, stride ldx): weight blocks
// are dequantized in registers exactly as ggml's dequantize_row_* does, so the
// products equal the full-precision path's; fp32 accumulation (Highway).
void gemm_q_f32(QType type, const uint8_t* W, size_t row_bytes, size_t nb, size_t r0, size_t r1,
                const float* X, size_t ldx, size_t n_tok, float* Y, size_t ldy);

// Any other GGUF block type `ggml_type` the reference dequantizer knows (Q4_K,
// Q6_K, Q5_0, ...): rows of row_bytes / block_bytes blocks of block_elems
// elements. Each block is dequantized with touchstone::gguf::dequantize_row
// (ggml's numbers bit for bit) into a stack buffer inside the kernel (no
// dequantized copy of the matrix) and multiplied with fp32 activations; per
// output the same sequence as gemm_q_f32 (blocks in order, N-lane chunks in
// order, one FMA each, SumOfLanes), so results do not depend on tiling.
// block_elems <= 256.
void gemm_blocks_f32(int ggml_type, const uint8_t* W, size_t row_bytes, size_t block_elems,
                     size_t block_bytes, size_t r0, size_t r1, const float* X, size_t ldx,
                     size_t n_tok, float* Y, size_t ldy);

// n_blocks GGUF blocks of `ggml_type` (block_elems values, block_bytes bytes
// each) dequantized to fp32, bit for bit as touchstone::gguf::dequantize_row
// (Q4_K and Q6_K with vectors, other types through that routine). Used by
// gemm_blocks_f32.
void dequantize_blocks(int ggml_type, const uint8_t* src, float* dst, size_t n_blocks,
                       size_t block_elems, size_t block_bytes);

enum class QLevel : int { Scalar = 0, AVX2 = 1, AVX512VNNI = 2 };
QLevel qlevel_best();             // best the CPU supports, capped by cap_qlevel
QLevel qlevel();                  // currently used
void force_qlevel(QLevel level);  // tests; must be <= qlevel_best()
void cap_qlevel(QLevel cap);      // select_isa_from_env; also sets qlevel()
const char* qlevel_name(QLevel level);

}  // namespace touchstone::cpu_simd
