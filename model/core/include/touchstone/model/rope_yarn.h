// touchstone/model/rope_yarn.h - RoPE with YaRN frequencies (ModelConfig::rope_yarn).
//
// HF transformers modeling_rope_utils.py _compute_yarn_parameters (transformers 5.23):
//   pos_freqs = base^(2i/d); extrapolation = 1 / pos_freqs; interpolation = 1 / (factor *
//   pos_freqs); low, high = find_correction_range(beta_fast, beta_slow, d, base,
//   original_max_position_embeddings, truncate); extrapolation_factor_i = 1 -
//   clamp((i - low) / (high - low), 0, 1); inv_freq = interpolation * (1 - e_f) +
//   extrapolation * e_f; attention_factor = 0.1 ln(factor) + 1, which the rotary embedding
//   multiplies into cos and sin (GptOssRotaryEmbedding.forward).
// ggml (src/ggml-cpu/ops.cpp rope_yarn, src/ggml.c ggml_rope_yarn_corr_dims) computes the
// same ramp and mscale, with the correction range always rounded outwards (floor / ceil):
// RopeYarn::truncate.
//
// Numerics: frequencies, angles, cos/sin and the rotation in fp64, each output rounded
// once to fp32 (as ops::rope_neox).
#pragma once

#include <cstdint>
#include <vector>

#include "touchstone/model/model_config.h"

namespace touchstone::ops {

struct YarnFrequencies {
  std::vector<double> inv_freq;  // n_rot / 2 values
  double mscale = 1.0;           // multiplies cos and sin
};

// The YaRN inverse frequencies of n_rot rotary dims at RoPE base `base`.
YarnFrequencies yarn_frequencies(const RopeYarn& y, int64_t n_rot, double base);

// Rotates the first n_rot values of v at position pos by angles pos * inv_freq[i], scaled
// by mscale: NeoX pairs (i, i + n_rot/2) when neox, else interleaved pairs (2i, 2i + 1).
void rope_with_frequencies(float* v, int64_t n_rot, int32_t pos, const YarnFrequencies& fr,
                           bool neox);

}  // namespace touchstone::ops
