// vk_graph.cpp - the forward graph of one pass (vk_forward.h: Pass), driven by
// the ModelConfig (reference/transformer/src/reference_forward.cpp has the formulas):
//   x = embd[token] * embd_scale
//   per layer: RMSNorm -> Q/K/V matmuls (+ biases) -> per-head QK RMSNorm ->
//     RoPE (interleaved or NeoX, first n_rot dims, this layer's table) + KV store ->
//     attention (GQA, this layer's sliding window, attn_scale) -> Wo
//     (-> post-attention RMSNorm) -> x +=;
//     RMSNorm -> gate/up -> SwiGLU or GeGLU -> down (-> post-FFN RMSNorm) -> x +=,
//     or a mixture of experts (vk_moe.cpp: router, the selected experts' gated
//     FFNs, their weighted sum) -> x +=
//   final RMSNorm -> LM head (-> soft-capping) (-> argmax).
// Everything but RoPE + KV store and attention runs over all rows of the pass
// at once; those two run per segment (sequence) against its own KV cache,
// bound through its own descriptor cache. A row's result does not depend on
// the other rows: every kernel reduces in an order fixed by the row's own
// sizes (docs/backends/vulkan.md#serving).
#include <algorithm>
#include <cmath>

#include "vk_forward.h"
#include "vk_matmul.h"

namespace touchstone::vk {
namespace {

uint32_t groups(uint32_t n) { return (n + kWorkgroup - 1) / kWorkgroup; }

}  // namespace

void Forward::record_tap(Recorder& r, const Segment& s, const Buffer& src, uint32_t row, size_t l,
                         uint32_t point) {
  const uint32_t d = uint32_t(w_.config.n_embd);
  Recorder rs = r.with(s.f->sets_);
  rs.dispatch(k_.copy(), {&src, &s.f->taps_buf_},
              CopyPush{d, row * d, (uint32_t(l) * TS_TAP_POINTS + point) * d}, groups(d));
}

void Forward::record_taps(Recorder& r, const Pass& p, const Buffer& src, size_t l, uint32_t point) {
  for (const Segment& s : p.segs)
    if (s.tap) record_tap(r, s, src, s.row0 + s.n - 1, l, point);
}

void Forward::record_block_out(Recorder& r, const Pass& p, const DeviceMatrix& W, const Buffer& in,
                               const Buffer& post_norm, size_t l, uint32_t point,
                               const Buffer& bias) {
  const ModelConfig& c = w_.config;
  const uint32_t d = uint32_t(c.n_embd), n_in = W.n_in, n = p.n;
  Activations& a = p.act;
  if (bias.size() != 0) {  // gpt-oss's attention output bias, added before the residual
    record_matmul(r, k_, W, in, a.blk, MatmulPush{n_in, d, n, 0, n_in, 0, d, 0});
    r.barrier();
    r.dispatch(k_.bias_add(), {&a.blk, &bias}, BiasAddPush{d, n}, groups(d * n));
    r.barrier();
    record_residual_add(r, p, post_norm, l, point);
    return;
  }
  if (post_norm.size() == 0 && !p.tap) {  // straight into the residual stream
    record_matmul(r, k_, W, in, a.x, MatmulPush{n_in, d, n, 0, n_in, 0, d, 1});
    r.barrier();
    return;
  }
  // Kept apart, then added: the same fp32 sum x + (W in) as the accumulate above.
  record_matmul(r, k_, W, in, a.blk, MatmulPush{n_in, d, n, 0, n_in, 0, d, 0});
  r.barrier();
  record_residual_add(r, p, post_norm, l, point);
}

void Forward::record_residual_add(Recorder& r, const Pass& p, const Buffer& post_norm, size_t l,
                                  uint32_t point) {
  const ModelConfig& c = w_.config;
  const uint32_t d = uint32_t(c.n_embd), n = p.n;
  Activations& a = p.act;
  if (post_norm.size() != 0) {
    const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);
    r.dispatch(k_.rms_norm(), {&a.blk, &post_norm, &a.blk}, RmsNormPush{d, n, 0, d, 0, d, eps}, n);
    r.barrier();
  }
  r.dispatch(k_.add(), {&a.x, &a.blk}, AddPush{n * d}, groups(n * d));
  if (p.tap) record_taps(r, p, a.blk, l, point);
  r.barrier();
}

// Layer l's attention block over the pass: x += block output.
void Forward::record_attention(Recorder& r, const Pass& p, size_t l) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  Activations& a = p.act;
  const uint32_t d = uint32_t(c.n_embd), hd = uint32_t(c.head_dim), n = p.n;
  const uint32_t q_dim = uint32_t(c.n_head) * hd, kv_dim = uint32_t(c.n_head_kv) * hd;
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);  // rms_eps_10x fault
  r.dispatch(k_.rms_norm(), {&a.x, &L.attn_norm, &a.xn}, RmsNormPush{d, n, 0, d, 0, d, eps}, n);
  r.barrier();
  record_matmul(r, k_, L.wq, a.xn, a.q, MatmulPush{d, q_dim, n, 0, d, 0, q_dim, 0});
  record_matmul(r, k_, L.wk, a.xn, a.k, MatmulPush{d, kv_dim, n, 0, d, 0, kv_dim, 0});
  record_matmul(r, k_, L.wv, a.xn, a.v, MatmulPush{d, kv_dim, n, 0, d, 0, kv_dim, 0});
  r.barrier();
  if (c.qkv_bias) {
    r.dispatch(k_.bias_add(), {&a.q, &L.bq}, BiasAddPush{q_dim, n}, groups(q_dim * n));
    r.dispatch(k_.bias_add(), {&a.k, &L.bk}, BiasAddPush{kv_dim, n}, groups(kv_dim * n));
    r.dispatch(k_.bias_add(), {&a.v, &L.bv}, BiasAddPush{kv_dim, n}, groups(kv_dim * n));
    r.barrier();
  }
  if (c.qk_norm) {  // RMSNorm of every head vector, in place
    const uint32_t nq = n * uint32_t(c.n_head), nk = n * uint32_t(c.n_head_kv);
    r.dispatch(k_.rms_norm(), {&a.q, &L.q_norm, &a.q}, RmsNormPush{hd, nq, 0, hd, 0, hd, eps}, nq);
    r.dispatch(k_.rms_norm(), {&a.k, &L.k_norm, &a.k}, RmsNormPush{hd, nk, 0, hd, 0, hd, eps}, nk);
    r.barrier();
  }
  const uint32_t neox = c.rope_style == RopeStyle::NeoX ? 1u : 0u;
  for (const Segment& s : p.segs) {  // disjoint rows and caches: no barrier between them
    Forward& f = *s.f;
    r.with(f.sets_).dispatch(
        k_.rope_store(),
        {&a.q, &a.k, &a.v, &f.kv_->k[l], &f.kv_->v[l], &f.rope_tables_[f.rope_of_layer_[l]]},
        RopeStorePush{s.n, s.pos0, uint32_t(c.n_head), uint32_t(c.n_head_kv), hd, s.rope_origin,
                      uint32_t(c.n_rot), neox, s.row0},
        s.n);
  }
  r.barrier();
  if (faults_.batch_page_boundary_leak) record_page_leak(r, p, l, false);
  // Faults: attention_scale (1/hd), kv_position_off_by_one (drop_newest),
  // rewind_noop (kv_len kept past a rewind: the stale entries are attended).
  const double scale = faults_.attention_scale ? 1.0 / double(hd) : c.attn_scale;
  for (const Segment& s : p.segs) {
    AttentionPush ap{s.n,
                     s.pos0,
                     uint32_t(c.n_head),
                     uint32_t(c.n_head_kv),
                     hd,
                     a.score_stride,
                     faults_.kv_off_by_one ? 1u : 0u,
                     static_cast<float>(scale),
                     s.kv_len,
                     uint32_t(c.layers[l].sliding_window),
                     s.row0,
                     L.sinks.size() != 0 ? 1u : 0u};
    ap.whole_chunk = s.bidirectional ? 1u : 0u;
    const Buffer& sinks = L.sinks.size() != 0 ? L.sinks : a.q;  // bound, unread without sinks
    r.with(s.f->sets_)
        .dispatch(k_.attention(hd),
                  {&a.q, &s.f->kv_->k[l], &s.f->kv_->v[l], &a.scores, &a.att, &sinks}, ap,
                  uint32_t(c.n_head), s.n);
  }
  r.barrier();
  if (faults_.batch_page_boundary_leak) record_page_leak(r, p, l, true);
  record_block_out(r, p, L.wo, a.att, L.post_attn_norm, l, TS_TAP_ATTN_OUT, L.bo);
}

// Layer l's gated FFN over the pass: x += block output.
// act(gate xn) * (up xn) into a.gate for the pass's rows (glu.comp's act: 0 SwiGLU, 1
// GeGLU): the dense FFN before its down projection, and qwen2moe's shared expert.
void Forward::record_gate_up_act(Recorder& r, const Pass& p, const DeviceMatrix& gate,
                                 const DeviceMatrix& up, uint32_t n_ff, uint32_t act) {
  Activations& a = p.act;
  const uint32_t d = uint32_t(w_.config.n_embd), n = p.n;
  record_matmul(r, k_, gate, a.xn, a.gate, MatmulPush{d, n_ff, n, 0, d, 0, n_ff, 0});
  record_matmul(r, k_, up, a.xn, a.up, MatmulPush{d, n_ff, n, 0, d, 0, n_ff, 0});
  r.barrier();
  r.dispatch(k_.glu(), {&a.gate, &a.up}, GluPush{n * n_ff, act}, groups(n * n_ff));
  r.barrier();
}

void Forward::record_ffn(Recorder& r, const Pass& p, size_t l) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  Activations& a = p.act;
  const uint32_t d = uint32_t(c.n_embd), n_ff = uint32_t(c.n_ff), n = p.n;
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);
  r.dispatch(k_.rms_norm(), {&a.x, &L.ffn_norm, &a.xn}, RmsNormPush{d, n, 0, d, 0, d, eps}, n);
  r.barrier();
  if (c.is_moe()) {
    record_moe(r, p, l);  // the block output into blk
    record_residual_add(r, p, L.post_ffn_norm, l, TS_TAP_FFN_OUT);
    if (p.tap) record_taps(r, p, a.x, l, TS_TAP_RESIDUAL);
    return;
  }
  record_gate_up_act(r, p, L.gate, L.up, n_ff,
                     c.ffn_activation == FfnActivation::GeluTanh ? 1u : 0u);
  record_block_out(r, p, L.down, a.gate, L.post_ffn_norm, l, TS_TAP_FFN_OUT);
  if (p.tap) record_taps(r, p, a.x, l, TS_TAP_RESIDUAL);
}

// Final RMSNorm of each segment's logits rows into consecutive rows of xn, the
// LM head over them (-> soft-capping) (-> the argmax of the last row).
void Forward::record_logits(Recorder& r, const Pass& p) {
  const ModelConfig& c = w_.config;
  Activations& a = p.act;
  const uint32_t d = uint32_t(c.n_embd), vocab = uint32_t(c.n_vocab), rows = p.out_rows;
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);  // rms_eps_10x fault
  for (const Segment& s : p.segs) {
    if (s.out_rows == 0) continue;
    const uint32_t first = s.row0 + s.n - s.out_rows;
    r.dispatch(k_.rms_norm(), {&a.x, &w_.output_norm, &a.xn},
               RmsNormPush{d, s.out_rows, first * d, d, s.out_row0 * d, d, eps}, s.out_rows);
  }
  r.barrier();
  const DeviceMatrix& head = w_.lm_head();
  record_matmul(r, k_, head, a.xn, a.logits, MatmulPush{d, vocab, rows, 0, d, 0, vocab, 0});
  if (c.final_logit_softcap != 0.0) {
    r.barrier();
    r.dispatch(k_.softcap(), {&a.logits}, SoftcapPush{vocab, 0, float(c.final_logit_softcap)},
               groups(vocab), rows);
  }
  if (p.argmax) {  // of the last row written
    r.barrier();
    r.dispatch(k_.argmax(), {&a.logits, &argmax_}, ArgmaxPush{vocab, (rows - 1) * vocab}, 1);
  }
}

void Forward::record(Recorder& r, const Pass& p) {
  const ModelConfig& c = w_.config;
  const uint32_t d = uint32_t(c.n_embd), n = p.n;
  Activations& a = p.act;
  if (p.embd) {  // ABI v8: the input embeddings as given (no embedding scale)
    r.dispatch(k_.copy(), {&a.embd, &a.x}, CopyPush{n * d, 0, 0}, groups(n * d));
  } else {
    for (const MatrixPart& part : w_.token_embd.parts) {  // each writes the tokens in its rows
      r.dispatch(k_.get_rows(w_.token_embd.type), {&part.buf, &a.tokens, &a.x},
                 GetRowsPush{d, n, 0, part.n_rows, float(c.embd_scale), part.row0}, n);
    }
  }
  r.barrier();
  // The last_layer_skipped fault: the loop stops one layer early (a skipped
  // layer's taps: zero block outputs, the residual unchanged).
  const size_t n_layer = w_.layers.size() - (faults_.last_layer_skipped ? 1 : 0);
  for (size_t l = 0; l < n_layer; ++l) {
    record_attention(r, p, l);
    record_ffn(r, p, l);
  }
  for (size_t l = n_layer; p.tap && l < w_.layers.size(); ++l)
    record_taps(r, p, a.x, l, TS_TAP_RESIDUAL);
  // Logits of the rows that need them (an inner prefill chunk: only the KV cache matters).
  if (p.out_rows > 0) record_logits(r, p);
  r.host_barrier();
}

}  // namespace touchstone::vk
