// vk_graph.cpp - the forward graph of one chunk of n tokens, driven by the
// ModelConfig (reference/model/src/reference_forward.cpp has the formulas):
//   x = embd[token] * embd_scale
//   per layer: RMSNorm -> Q/K/V matmuls (+ biases) -> per-head QK RMSNorm ->
//     RoPE (interleaved or NeoX, first n_rot dims, this layer's table) + KV store ->
//     attention (GQA, this layer's sliding window, attn_scale) -> Wo
//     (-> post-attention RMSNorm) -> x +=;
//     RMSNorm -> gate/up -> SwiGLU or GeGLU -> down (-> post-FFN RMSNorm) -> x +=
//   final RMSNorm -> LM head (-> soft-capping) (-> argmax).
#include <algorithm>
#include <cmath>

#include "vk_forward.h"

namespace touchstone::vk {
namespace {

uint32_t groups(uint32_t n) { return (n + kWorkgroup - 1) / kWorkgroup; }

// Y (+)= W X over W's parts: part rows [row0, row0 + n_rows) write Y's columns
// from row0 (p.n_out: ignored, each part's rows).
void matmul(Recorder& r, const Kernels& k, const DeviceMatrix& W, const Buffer& x, const Buffer& y,
            MatmulPush p) {
  const uint32_t y_off = p.y_off;
  for (const MatrixPart& part : W.parts) {
    p.n_out = part.n_rows;
    p.y_off = y_off + part.row0;
    record_matmul(r, k, W.type, part.buf, x, y, p);
  }
}

}  // namespace

void Forward::record_tap(Recorder& r, const Buffer& src, uint32_t row, size_t l, uint32_t point) {
  const uint32_t d = uint32_t(w_.config.n_embd);
  r.dispatch(k_.copy(), {&src, &taps_buf_},
             CopyPush{d, row * d, (uint32_t(l) * TS_TAP_POINTS + point) * d}, groups(d));
}

void Forward::record_block_out(Recorder& r, const DeviceMatrix& W, const Buffer& in,
                               const Buffer& post_norm, uint32_t n, bool tap, size_t l,
                               uint32_t point) {
  const ModelConfig& c = w_.config;
  const uint32_t d = uint32_t(c.n_embd), n_in = W.n_in;
  const bool norm = post_norm.size() != 0;
  if (!norm && !tap) {  // straight into the residual stream
    matmul(r, k_, W, in, x_, MatmulPush{n_in, d, n, 0, n_in, 0, d, 1});
    r.barrier();
    return;
  }
  // Kept apart, then added: the same fp32 sum x + (W in) as the accumulate above.
  matmul(r, k_, W, in, blk_, MatmulPush{n_in, d, n, 0, n_in, 0, d, 0});
  r.barrier();
  if (norm) {
    const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);
    r.dispatch(k_.rms_norm(), {&blk_, &post_norm, &blk_}, RmsNormPush{d, n, 0, d, 0, d, eps}, n);
    r.barrier();
  }
  r.dispatch(k_.add(), {&x_, &blk_}, AddPush{n * d}, groups(n * d));
  if (tap) record_tap(r, blk_, n - 1, l, point);
  r.barrier();
}

// Layer l's attention block over the chunk: x_ += block output.
void Forward::record_attention(Recorder& r, size_t l, uint32_t n, bool tap) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  const uint32_t d = uint32_t(c.n_embd), hd = uint32_t(c.head_dim);
  const uint32_t q_dim = uint32_t(c.n_head) * hd, kv_dim = uint32_t(c.n_head_kv) * hd;
  const uint32_t pos0 = uint32_t(pos_);
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);  // rms_eps_10x fault
  r.dispatch(k_.rms_norm(), {&x_, &L.attn_norm, &xn_}, RmsNormPush{d, n, 0, d, 0, d, eps}, n);
  r.barrier();
  matmul(r, k_, L.wq, xn_, q_, MatmulPush{d, q_dim, n, 0, d, 0, q_dim, 0});
  matmul(r, k_, L.wk, xn_, k_buf_, MatmulPush{d, kv_dim, n, 0, d, 0, kv_dim, 0});
  matmul(r, k_, L.wv, xn_, v_, MatmulPush{d, kv_dim, n, 0, d, 0, kv_dim, 0});
  r.barrier();
  if (c.qkv_bias) {
    r.dispatch(k_.bias_add(), {&q_, &L.bq}, BiasAddPush{q_dim, n}, groups(q_dim * n));
    r.dispatch(k_.bias_add(), {&k_buf_, &L.bk}, BiasAddPush{kv_dim, n}, groups(kv_dim * n));
    r.dispatch(k_.bias_add(), {&v_, &L.bv}, BiasAddPush{kv_dim, n}, groups(kv_dim * n));
    r.barrier();
  }
  if (c.qk_norm) {  // RMSNorm of every head vector, in place
    const uint32_t nq = n * uint32_t(c.n_head), nk = n * uint32_t(c.n_head_kv);
    r.dispatch(k_.rms_norm(), {&q_, &L.q_norm, &q_}, RmsNormPush{hd, nq, 0, hd, 0, hd, eps}, nq);
    r.dispatch(k_.rms_norm(), {&k_buf_, &L.k_norm, &k_buf_}, RmsNormPush{hd, nk, 0, hd, 0, hd, eps},
               nk);
    r.barrier();
  }
  const uint32_t neox = c.rope_style == RopeStyle::NeoX ? 1u : 0u;
  r.dispatch(k_.rope_store(),
             {&q_, &k_buf_, &v_, &kc_[l], &vc_[l], &rope_tables_[rope_of_layer_[l]]},
             RopeStorePush{n, pos0, uint32_t(c.n_head), uint32_t(c.n_head_kv), hd, rope_origin_,
                           uint32_t(c.n_rot), neox},
             n);
  r.barrier();
  // Faults: attention_scale (1/hd), kv_position_off_by_one (drop_newest),
  // rewind_noop (kv_len_ kept past a rewind: the stale entries are attended).
  const double scale = faults_.attention_scale ? 1.0 / double(hd) : c.attn_scale;
  const AttentionPush ap{n,
                         pos0,
                         uint32_t(c.n_head),
                         uint32_t(c.n_head_kv),
                         hd,
                         uint32_t(max_ctx_),
                         faults_.kv_off_by_one ? 1u : 0u,
                         static_cast<float>(scale),
                         uint32_t(std::max(kv_len_, pos_ + int32_t(n))),
                         uint32_t(c.layers[l].sliding_window)};
  r.dispatch(k_.attention(hd), {&q_, &kc_[l], &vc_[l], &scores_, &att_}, ap, uint32_t(c.n_head), n);
  r.barrier();
  record_block_out(r, L.wo, att_, L.post_attn_norm, n, tap, l, TS_TAP_ATTN_OUT);
}

// Layer l's gated FFN over the chunk: x_ += block output.
void Forward::record_ffn(Recorder& r, size_t l, uint32_t n, bool tap) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  const uint32_t d = uint32_t(c.n_embd), n_ff = uint32_t(c.n_ff);
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);
  r.dispatch(k_.rms_norm(), {&x_, &L.ffn_norm, &xn_}, RmsNormPush{d, n, 0, d, 0, d, eps}, n);
  r.barrier();
  matmul(r, k_, L.gate, xn_, gate_, MatmulPush{d, n_ff, n, 0, d, 0, n_ff, 0});
  matmul(r, k_, L.up, xn_, up_, MatmulPush{d, n_ff, n, 0, d, 0, n_ff, 0});
  r.barrier();
  const uint32_t gelu = c.ffn_activation == FfnActivation::GeluTanh ? 1u : 0u;
  r.dispatch(k_.glu(), {&gate_, &up_}, GluPush{n * n_ff, gelu}, groups(n * n_ff));
  r.barrier();
  record_block_out(r, L.down, gate_, L.post_ffn_norm, n, tap, l, TS_TAP_FFN_OUT);
  if (tap) record_tap(r, x_, n - 1, l, TS_TAP_RESIDUAL);
}

void Forward::record(Recorder& r, uint32_t n, bool all_positions, bool want_logits, bool argmax,
                     bool tap) {
  const ModelConfig& c = w_.config;
  const uint32_t d = uint32_t(c.n_embd), vocab = uint32_t(c.n_vocab);
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);  // rms_eps_10x fault

  for (const MatrixPart& part : w_.token_embd.parts) {  // each writes the tokens in its rows
    r.dispatch(k_.get_rows(w_.token_embd.type), {&part.buf, &tokens_, &x_},
               GetRowsPush{d, n, 0, part.n_rows, float(c.embd_scale), part.row0}, n);
  }
  r.barrier();
  // The last_layer_skipped fault: the loop stops one layer early (a skipped
  // layer's taps: zero block outputs, the residual unchanged).
  const size_t n_layer = w_.layers.size() - (faults_.last_layer_skipped ? 1 : 0);
  for (size_t l = 0; l < n_layer; ++l) {
    record_attention(r, l, n, tap);
    record_ffn(r, l, n, tap);
  }
  for (size_t l = n_layer; tap && l < w_.layers.size(); ++l)
    record_tap(r, x_, n - 1, l, TS_TAP_RESIDUAL);
  if (!want_logits) return;  // an inner prefill chunk: only the KV cache matters
  // Final norm and LM head: every position, or only the last one.
  const uint32_t rows = all_positions ? n : 1, first = all_positions ? 0 : n - 1;
  r.dispatch(k_.rms_norm(), {&x_, &w_.output_norm, &xn_},
             RmsNormPush{d, rows, first * d, d, 0, d, eps}, rows);
  r.barrier();
  const DeviceMatrix& head = w_.lm_head();
  matmul(r, k_, head, xn_, logits_, MatmulPush{d, vocab, rows, 0, d, 0, vocab, 0});
  if (c.final_logit_softcap != 0.0) {
    r.barrier();
    r.dispatch(k_.softcap(), {&logits_}, SoftcapPush{vocab, 0, float(c.final_logit_softcap)},
               groups(vocab), rows);
  }
  if (argmax) {  // of the last row written
    r.barrier();
    r.dispatch(k_.argmax(), {&logits_, &argmax_}, ArgmaxPush{vocab, (rows - 1) * vocab}, 1);
  }
  r.host_barrier();
}

}  // namespace touchstone::vk
