// engine_pass.cpp - one forward pass of the cpu_simd engine over the tokens of
// one or several sessions (engine.h: SimdSession::Seg), every family of
// ModelConfig in one pass, like the reference
// (reference/transformer/src/reference_forward.cpp): RMSNorm, optional Q/K/V biases,
// optional per-head QK-norm, interleaved or NeoX RoPE on the first n_rot
// dimensions (per-layer base / linear scale, rope_freqs divisors, or YaRN
// frequencies and mscale), GQA with an optional sliding window, attention sinks
// and the model's attention scale, an optional output-projection bias, optional
// post-attention / post-FFN norms, SwiGLU or GeGLU (or a mixture of experts:
// engine_moe.cpp), embedding scale, optional final logit soft-capping.
// Every matrix runs once over all tokens of the pass (linears); per token: norms,
// RoPE at its own position, K/V written into its own session's cache; attention
// per token against its own session's cache.
// Numerics: engine.cpp's header and docs/backends/cpu_simd.md.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine.h"
#include "engine_ops.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/scalar_ops.h"

namespace touchstone::cpu_simd {

using ops::rms_norm;

void SimdSession::forward_chunk(const int32_t* tokens, int32_t n, bool all_positions, float* logits,
                                int32_t rope_origin) {
  Seg g;
  g.s = this;
  g.tokens = tokens;
  g.n = n;
  g.pos = pos_;
  g.rope_pos = pos_ - rope_origin;
  g.all_positions = all_positions;
  g.logits = logits;
  forward_pass(&g, 1);
}

void SimdSession::forward_pass(const Seg* segs, int n_segs) {
  segs_ = segs;
  n_segs_ = n_segs;
  n_tok_ = 0;
  blocks_.clear();
  const size_t group = size_t(c_.n_head / c_.n_head_kv);
  const int32_t tb = int32_t(std::max<size_t>(1, attn_queries() / group));
  for (int k = 0; k < n_segs; ++k) {
    const Seg& g = segs[k];
    for (int32_t i = 0; i < g.n; ++i) tok_seg_[size_t(g.first + i)] = k;
    for (int32_t i = 0; i < g.n; i += tb)
      blocks_.push_back({k, g.first + i, g.first + std::min(g.n, i + tb)});
    n_tok_ = g.first + g.n;
  }
  embed_and_rope();
  const int32_t n_layer = faults_.last_layer_skipped ? c_.n_layer - 1 : c_.n_layer;
  for (int32_t l = 0; l < n_layer; ++l) {
    attention_block(l);
    ffn_block(l);
  }
  // a skipped layer (fault) adds nothing: zero outputs, residual unchanged
  const std::vector<float> zero(n_layer < c_.n_layer ? pass_cap_ * size_t(c_.n_embd) : 0);
  for (int32_t l = n_layer; l < c_.n_layer; ++l) {
    taps_last_token(l, TS_TAP_ATTN_OUT, zero.data());
    taps_last_token(l, TS_TAP_FFN_OUT, zero.data());
    taps_last_token(l, TS_TAP_RESIDUAL, x_.data());
  }
  logits_head();
  for (int k = 0; k < n_segs; ++k) {
    SimdSession& s = *segs[k].s;
    s.pos_ += segs[k].n;
    s.kv_len_ = std::max(s.kv_len_, s.pos_);
    s.embd_last_ = segs[k].embd != nullptr;
  }
  segs_ = nullptr;
  n_segs_ = 0;
}

void SimdSession::embed_and_rope() {
  const size_t d = size_t(c_.n_embd), N = size_t(n_tok_), B = pass_cap_;
  const size_t half = size_t(c_.n_rot) / 2;
  const float* freq_factors = model_.rope_freqs();
  for (size_t i = 0; i < N; ++i) {
    const Seg& g = segs_[tok_seg_[i]];
    float* x = x_.data() + i * d;
    if (g.embd) {  // ABI v8: an input embedding, used as given (no embedding scale)
      std::copy_n(g.embd + size_t(int32_t(i) - g.first) * d, d, x);
      continue;
    }
    model_.embed(g.tokens[int32_t(i) - g.first], !quant_, x);
    if (c_.embd_scale != 1.0) {  // Gemma: x * fp32(sqrt(n_embd)), fp64 product rounded once
      for (size_t j = 0; j < d; ++j) x[j] = static_cast<float>(double{x[j]} * c_.embd_scale);
    }
  }
  // RoPE angles depend on the position and the layer's (base, scale) only:
  // cos/sin once per pass and table, not per layer and head (the reference's
  // fp64 formula, ops::rope_theta, same values).
  pool_.run(rope_params_.size() * N, [&](size_t task, int) {
    const size_t k = task / N, i = task % N;
    const auto [base, scale] = rope_params_[k];
    const Seg& g = segs_[tok_seg_[i]];
    const int32_t pos = g.rope_pos + (int32_t(i) - g.first);
    double* cs_sn = rope_cs_.data() + (k * B + i) * 2 * half;
    if (!rope_yarn_.empty()) {  // YaRN: ops::rope_with_frequencies' angles and mscale
      const touchstone::ops::YarnFrequencies& fr = rope_yarn_[k];
      for (size_t j = 0; j < half; ++j) {
        const double theta = double(pos) * fr.inv_freq[j];
        cs_sn[2 * j] = std::cos(theta) * fr.mscale;
        cs_sn[2 * j + 1] = std::sin(theta) * fr.mscale;
      }
      return;
    }
    for (size_t j = 0; j < half; ++j) {
      const double fj = freq_factors ? double{freq_factors[j]} : 1.0;
      const double theta = touchstone::ops::rope_theta(pos, int64_t(j), c_.n_rot, base, scale, fj);
      cs_sn[2 * j] = std::cos(theta);
      cs_sn[2 * j + 1] = std::sin(theta);
    }
  });
}

// Norm, Q/K/V, per token biases / QK-norm / RoPE / KV append, attention,
// output projection, post-norm, residual add.
void SimdSession::attention_block(int32_t l) {
  const size_t d = size_t(c_.n_embd), hd = size_t(c_.head_dim), N = size_t(n_tok_);
  const size_t qd = size_t(c_.n_head) * hd, kvd = size_t(c_.n_head_kv) * hd;
  const size_t half = size_t(c_.n_rot) / 2;
  const double eps = c_.rms_norm_eps * faults_.rms_eps_scale;
  const bool neox = (c_.rope_style == touchstone::RopeStyle::NeoX) != faults_.rope_layout;
  const LayerView& L = w_->layers[size_t(l)];
  const double* rope_table =
      rope_cs_.data() + size_t(layer_rope_[size_t(l)]) * pass_cap_ * 2 * half;
  for (size_t i = 0; i < N; ++i)
    rms_norm(x_.data() + i * d, L.attn_norm, xn_.data() + i * d, d, eps);
  const Job qkv[3] = {{&L.wq, q_.data(), qd}, {&L.wk, k_.data(), kvd}, {&L.wv, v_.data(), kvd}};
  linears(qkv, 3, xn_.data(), d, N);
  pool_.run(N, [&](size_t i, int) {
    float* q = q_.data() + i * qd;
    float* k = k_.data() + i * kvd;
    float* v = v_.data() + i * kvd;
    if (L.bq) {
      ops::add_bias(q, L.bq, qd);
      ops::add_bias(k, L.bk, kvd);
      ops::add_bias(v, L.bv, kvd);
    }
    if (L.q_norm) {
      for (int32_t h = 0; h < c_.n_head; ++h) rms_norm(q + h * hd, L.q_norm, q + h * hd, hd, eps);
      for (int32_t h = 0; h < c_.n_head_kv; ++h)
        rms_norm(k + h * hd, L.k_norm, k + h * hd, hd, eps);
    }
    const double* cs_sn = rope_table + i * 2 * half;
    auto rope = [&](float* x) {
      // pairs (2j, 2j+1) (interleaved) or (j, j + n_rot/2) (NeoX)
      const size_t stride = neox ? 1 : 2, other = neox ? half : 1;
      for (size_t j = 0; j < half; ++j) {
        const double cs = cs_sn[2 * j], sn = cs_sn[2 * j + 1];
        float* a = x + j * stride;
        const double x0 = a[0], x1 = a[other];
        a[0] = static_cast<float>(x0 * cs - x1 * sn);
        a[other] = static_cast<float>(x0 * sn + x1 * cs);
      }
    };
    for (int32_t h = 0; h < c_.n_head; ++h) rope(q + size_t(h) * hd);
    for (int32_t h = 0; h < c_.n_head_kv; ++h) rope(k + size_t(h) * hd);
    const Seg& g = segs_[tok_seg_[i]];
    // the kv_write_next fault: p + 1
    const size_t p = size_t(g.pos + (int32_t(i) - g.first)) + (faults_.kv_write_next ? 1 : 0);
    if (p < size_t(g.s->max_ctx_)) {
      std::memcpy(g.s->k_rows(l) + p * kvd, k, kvd * sizeof(float));
      std::memcpy(g.s->v_rows(l) + p * kvd, v, kvd * sizeof(float));
    }
  });
  attention(l);
  const Job o[1] = {{&L.wo, tmp_.data(), d}};
  linears(o, 1, att_.data(), qd, N);
  if (L.bo) {  // gpt-oss: the output projection's bias
    for (size_t i = 0; i < N; ++i) ops::add_bias(tmp_.data() + i * d, L.bo, d);
  }
  if (L.post_attn_norm) {
    for (size_t i = 0; i < N; ++i)
      rms_norm(tmp_.data() + i * d, L.post_attn_norm, tmp_.data() + i * d, d, eps);
  }
  for (size_t i = 0; i < N * d; ++i) x_[i] += tmp_[i];
  taps_last_token(l, TS_TAP_ATTN_OUT, tmp_.data());
}

// Norm, gate / up, act(gate) * up, down (or the mixture of experts:
// engine_moe.cpp), post-norm, residual add.
// out = down(act(gate xn_) * (up xn_)) for the pass's rows (gate_, up_ as scratch): the
// dense FFN, and qwen2moe's shared expert (engine_moe.cpp).
void SimdSession::gated_ffn(const Linear& gate, const Linear& up, const Linear& down, size_t ff,
                            float* out) {
  const size_t d = size_t(c_.n_embd), N = size_t(n_tok_);
  const Job gu[2] = {{&gate, gate_.data(), ff}, {&up, up_.data(), ff}};
  linears(gu, 2, xn_.data(), d, N);
  gated_activation(N, ff);
  const Job dn[1] = {{&down, out, d}};
  linears(dn, 1, gate_.data(), ff, N);
}

void SimdSession::ffn_block(int32_t l) {
  const size_t d = size_t(c_.n_embd), ff = size_t(c_.n_ff), N = size_t(n_tok_);
  const double eps = c_.rms_norm_eps * faults_.rms_eps_scale;
  const LayerView& L = w_->layers[size_t(l)];
  for (size_t i = 0; i < N; ++i)
    rms_norm(x_.data() + i * d, L.ffn_norm, xn_.data() + i * d, d, eps);
  if (c_.is_moe()) {
    moe_ffn(l);
  } else {
    gated_ffn(L.gate, L.up, L.down, ff, tmp_.data());
  }
  if (L.post_ffn_norm) {
    for (size_t i = 0; i < N; ++i)
      rms_norm(tmp_.data() + i * d, L.post_ffn_norm, tmp_.data() + i * d, d, eps);
  }
  for (size_t i = 0; i < N * d; ++i) x_[i] += tmp_[i];
  taps_last_token(l, TS_TAP_FFN_OUT, tmp_.data());
  taps_last_token(l, TS_TAP_RESIDUAL, x_.data());
}

// act(gate) * up in fp64, rounded once (act = SiLU or tanh-GELU, vector
// fp64 tanh / exp: kernels.h gated_act_f64); split into fixed slices of
// kActSlice so decode (one token) uses every thread too.
void SimdSession::gated_activation(size_t n_tok, size_t ff) {
  const bool gelu = c_.ffn_activation == touchstone::FfnActivation::GeluTanh;
  constexpr size_t kActSlice = 256;
  const size_t n_slices = ops::ceil_div(ff, kActSlice);
  pool_.run(n_tok * n_slices, [&](size_t task, int) {
    const size_t i = task / n_slices, j0 = (task % n_slices) * kActSlice;
    gated_act_f64(gelu, gate_.data() + i * ff + j0, up_.data() + i * ff + j0,
                  std::min(ff, j0 + kActSlice) - j0);
  });
}

void SimdSession::tap(int32_t layer, int point, const float* row) {
  const size_t d = size_t(c_.n_embd);
  if (taps_.empty()) taps_.resize(size_t(c_.n_layer) * 3 * d);
  std::copy(row, row + d, taps_.data() + (size_t(layer) * 3 + size_t(point)) * d);
}

// Layer taps: the last token of each segment whose session records them
// (rows: the pass's [n_tok][n_embd] values).
void SimdSession::taps_last_token(int32_t layer, int point, const float* rows) {
  for (int k = 0; k < n_segs_; ++k) {
    const Seg& g = segs_[k];
    if (g.s->taps_on_) g.s->tap(layer, point, rows + size_t(g.first + g.n - 1) * size_t(c_.n_embd));
  }
}

// Final norm and LM head over every row a segment asks for (all its tokens,
// or its last one), one linears call; soft-capping, the logit-noise fault.
void SimdSession::logits_head() {
  const size_t d = size_t(c_.n_embd), V = size_t(c_.n_vocab);
  const double eps = c_.rms_norm_eps * faults_.rms_eps_scale;
  size_t R = 0;
  int with_rows = 0;
  const Seg* only = nullptr;
  for (int k = 0; k < n_segs_; ++k) {
    const Seg& g = segs_[k];
    const int32_t rows = g.rows();
    for (int32_t r = 0; r < rows; ++r, ++R) {
      const size_t i = size_t(g.first + (g.all_positions ? r : g.n - 1));
      rms_norm(x_.data() + i * d, w_->output_norm, xn_.data() + R * d, d, eps);
    }
    if (rows) ++with_rows, only = &g;
  }
  if (R == 0) return;
  // One segment: straight into its buffer; several: a scratch, copied out.
  if (with_rows > 1 && batch_logits_.size() < R * V) batch_logits_.resize(R * V);
  float* out = with_rows == 1 ? only->logits : batch_logits_.data();
  const Job head[1] = {{&w_->lm_head, out, V}};
  linears(head, 1, xn_.data(), d, R);
  if (c_.final_logit_softcap != 0.0) {
    const double cap = c_.final_logit_softcap;
    pool_.run(R, [&](size_t r, int) {
      float* row = out + r * V;
      for (size_t i = 0; i < V; ++i)
        row[i] = static_cast<float>(touchstone::ops::softcap(row[i], cap));
    });
  }
  R = 0;
  for (int k = 0; k < n_segs_; ++k) {
    const Seg& g = segs_[k];
    const size_t rows = size_t(g.rows());
    if (rows && with_rows > 1) std::memcpy(g.logits, out + R * V, rows * V * sizeof(float));
    R += rows;
    if (faults_.logit_noise == 0.0) continue;
    for (size_t r = 0; r < rows; ++r) {
      const int32_t p = g.pos + (g.all_positions ? int32_t(r) : g.n - 1);
      const uint64_t base = uint64_t(p) * uint64_t(V);
      float* row = g.logits + r * V;
      for (size_t i = 0; i < V; ++i) {
        row[i] = static_cast<float>(
            double{row[i]} * (1.0 + faults_.logit_noise * touchstone::fault_noise_sign(base + i)));
      }
    }
  }
}

}  // namespace touchstone::cpu_simd
