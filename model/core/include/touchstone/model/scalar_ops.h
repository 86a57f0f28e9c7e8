// touchstone/model/scalar_ops.h - the scalar primitives of the reference forward pass.
//
// Every function here is the definition the backends are compared with; their
// tests may call them directly. Conventions (the "documented accumulation order"):
//   - Inputs and outputs are fp32; every reduction accumulates in fp64 and every
//     elementwise formula is evaluated in fp64 and rounded once to fp32.
//   - Dot products of length n use four fp64 partial sums s_j over i = j (mod 4),
//     taken in increasing i, combined as (s0 + s1) + (s2 + s3); a tail (n % 4) is
//     added to s0 in order before combining. Other sums run in increasing index.
//   - Compiled with -ffp-contract=off -fno-fast-math: no FMA, no reassociation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace touchstone::ops {

// sum_i a[i] * b[i] in the four-partial-sum fp64 order above. Bitwise identical on
// every x86 target (the AVX2 clone keeps the same operations in the same order).
double dot(const float* a, const float* b, int64_t n);

// out = x / sqrt(mean(x^2) + eps) * weight  (HF LlamaRMSNorm; Gemma's "1 + weight" is
// folded into the GGUF weight by llama.cpp's converter). x and out may alias.
void rms_norm(const float* x, const float* weight, float* out, int64_t n, double eps);

// Angle of rotary pair i at position pos (HF _compute_default_rope_parameters and
// llama.cpp ggml_rope_ext): theta = pos / scale * base^(-2i / n_rot) / freq_factor.
// scale is the linear RoPE scaling factor (1 = none); freq_factor comes from
// rope_freqs.weight (Llama 3.1 "llama3" scaling; 1 = none).
inline double rope_theta(int32_t pos, int64_t i, int64_t n_rot, double base, double scale,
                         double freq_factor) {
  return static_cast<double>(pos) / scale *
         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot)) / freq_factor;
}

// Rotary embedding of one head vector v of which the first n_rot dimensions rotate
// (partial rotary leaves v[n_rot..] unchanged). freq_factors: n_rot/2 divisors or
// nullptr.
//  - interleaved: pairs (2i, 2i+1), the original Meta layout. llama.cpp's HF->GGUF
//    converter permutes the Q/K rows of the "llama" family so that this equals HF's
//    rotate_half on the original weights (LLAMA_ROPE_TYPE_NORM).
//  - neox: pairs (i, i + n_rot/2), HF's rotate_half as is (Qwen2/3, Gemma 3, Phi-3;
//    LLAMA_ROPE_TYPE_NEOX).
void rope_interleaved(float* v, int64_t n_rot, int32_t pos, double base, double scale,
                      const float* freq_factors);
void rope_neox(float* v, int64_t n_rot, int32_t pos, double base, double scale,
               const float* freq_factors);

// SiLU(x) = x / (1 + exp(-x))  (HF ACT2FN["silu"], the SwiGLU gate of Llama/Qwen/Phi-3).
inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

// GELU, tanh approximation (HF ACT2FN["gelu_pytorch_tanh"], the GeGLU gate of Gemma 3):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline double gelu_tanh(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

// gpt-oss's clamped SwiGLU of one (gate, up) pair (HF modeling_gpt_oss.py
// GptOssExperts._apply_gate: gate = gate.clamp(max=limit); up = up.clamp(-limit, limit);
// glu = gate * sigmoid(gate * alpha); (up + 1) * glu, with swiglu_alpha 1.702 and
// swiglu_limit 7.0, GptOssConfig's defaults and the released models'; llama.cpp
// ggml_swiglu_oai with the same constants, hard-coded in build_moe_ffn). The GGUF carries
// neither constant. The gate and up rows are split at conversion from HF's interleaved
// gate_up_proj (gate = [..., ::2], up = [..., 1::2]), convert_hf_to_gguf.py GptOssModel.
inline constexpr double kSwigluOaiAlpha = 1.702;
inline constexpr double kSwigluOaiLimit = 7.0;
inline double swiglu_oai(double gate, double up) {
  const double g = std::min(gate, kSwigluOaiLimit);
  const double u = std::clamp(up, -kSwigluOaiLimit, kSwigluOaiLimit);
  return (u + 1.0) * (g / (1.0 + std::exp(-g * kSwigluOaiAlpha)));
}

// Soft-capping (Gemma 2 style final_logit_softcapping): cap * tanh(x / cap).
inline double softcap(double x, double cap) { return cap * std::tanh(x / cap); }

}  // namespace touchstone::ops
