// cuda_forward.cpp - the forward pass of a Pass (cuda_session.h): one
// session's chunk (one segment) or the rows of several sessions (step_batch).
// Embedding, every RMSNorm, every matrix product (matrix-vector kernels for
// one row, cuBLAS SGEMM with CUBLAS_PEDANTIC_MATH for more), the gated FFN and
// the residual adds run over all rows of the pass with the lead session's
// buffers; RoPE + KV store and attention run per segment against that
// segment's own KV cache, reading its [position, KV floor] from the device.
// Everything is enqueued on the lead's stream; nothing here synchronizes, so
// one session's decode step can be captured as a CUDA graph.
#include <algorithm>
#include <cstdint>

#include "cuda_session.h"

namespace touchstone::cuda {
namespace {

// M as fp32 row-major [n_out][n_in] on the device (a quantized matrix is
// dequantized into the session's scratch first).
const float* dense(CudaSession& s, const DevMatrix& M) {
  if (M.type == WType::F32) return static_cast<const float*>(M.ptr);
  check_launch(launch_dequantize(M.type, M.ptr, as<float>(s.deq), M.n_out, M.n_in, s.stream),
               "dequantize kernel launch");
  return as<float>(s.deq);
}

// out[n][n_out] = A[:, c0:c0+nc] . in[n][c0:c0+nc] (cuBLAS SGEMM, fp32). Row-major A
// [n_out][n_in] is column-major A^T (lda = n_in); activations are column-major
// [n_in][n]; out column-major [n_out][n] = row-major [n][n_out].
void gemm_cols(CudaSession& s, const float* A, const DevMatrix& M, const float* in, float* out,
               int n, int c0, int nc) {
  const float one = 1.0f, zero = 0.0f;
  TS_CUBLAS(cublasSgemm(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, M.n_out, n, nc, &one, A + c0, M.n_in,
                        in + c0, M.n_in, &zero, out, M.n_out));
}

// out[n][n_out] = M . in[n][n_in]  (row-major activations). Faults: the
// reduction-order faults (s.split > 1: the columns cut into s.split slices of
// whole 32-element chunks, each slice's product rounded to fp16, the slices
// added in order in fp32, as vulkan's FAULT_SPLIT_K), fp16_accumulation
// (outputs rounded through fp16).
void linear(CudaSession& s, const DevMatrix& M, const float* in, float* out, int n) {
  const int64_t n_outs = int64_t{n} * M.n_out;
  if (s.split > 1) {
    const float* A = dense(s, M);
    const int nb = M.n_in / cm::kQK;
    for (int k = 0; k < s.split; ++k) {
      const int b0 = nb * k / s.split, b1 = nb * (k + 1) / s.split;
      if (b1 == b0) continue;
      gemm_cols(s, A, M, in, as<float>(s.split_part), n, b0 * cm::kQK, (b1 - b0) * cm::kQK);
      check_launch(launch_add_fp16_partial(out, as<float>(s.split_part), n_outs, b0 == 0, s.stream),
                   "add_fp16_partial");
    }
  } else if (n == 1) {
    check_launch(launch_matvec(M.type, M.ptr, in, out, M.n_out, M.n_in, s.stream),
                 "matvec kernel launch");
  } else {
    gemm_cols(s, dense(s, M), M, in, out, n, 0, M.n_in);
  }
  if (s.faults.fp16_accumulation)
    check_launch(launch_round_fp16(out, n_outs, s.stream), "round_fp16");
}

// linear() plus an optional bias ([n_out], Q/K/V biases).
void linear_bias(CudaSession& s, const DevMatrix& M, const float* bias, const float* in, float* out,
                 int n) {
  linear(s, M, in, out, n);
  if (bias) check_launch(launch_add_bias(out, bias, n, M.n_out, s.stream), "add_bias");
}

// Layer taps (ABI v4): the last row of each tapping segment of `rows` into its
// session's record [n_layer][TS_TAP_POINTS][n_embd] (rows = nullptr: zeros, a
// skipped layer).
void tap(CudaSession& s, const Pass& p, int layer, int point, const float* rows) {
  const size_t d = size_t(s.model->cfg.n_embd);
  for (const Segment& g : p.segs) {
    if (!g.tap) continue;
    float* dst = as<float>(g.s->taps) + (size_t(layer) * TS_TAP_POINTS + size_t(point)) * d;
    if (!rows) {
      TS_CUDA(cudaMemsetAsync(dst, 0, d * sizeof(float), s.stream));
      continue;
    }
    TS_CUDA(cudaMemcpyAsync(dst, rows + size_t(g.row0 + g.n - 1) * d, d * sizeof(float),
                            cudaMemcpyDeviceToDevice, s.stream));
  }
}

// RoPE + KV store and attention of layer l, segment by segment: q/k/v rows
// [row0, row0 + n) against the segment's own cache, RoPE table and device
// [position, KV floor]. The split-K partials are scratch of one launch pair:
// the stream orders a segment's attention after the previous one's merge.
void attend_segments(CudaSession& s, int l, const Pass& p) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const size_t hd = size_t(c.head_dim), q_dim = size_t(c.n_head) * hd,
               kv_dim = size_t(c.n_head_kv) * hd;
  RopeParams rp;
  rp.n_head = c.n_head, rp.n_head_kv = c.n_head_kv, rp.head_dim = c.head_dim, rp.n_rot = c.n_rot;
  rp.neox = (c.rope_style == touchstone::RopeStyle::NeoX) != s.faults.rope_layout;
  rp.write_offset = s.faults.kv_write_next ? 1 : 0;
  AttnParams ap;
  ap.n_head = c.n_head, ap.n_head_kv = c.n_head_kv, ap.head_dim = c.head_dim;
  ap.scale = static_cast<float>(s.faults.attention_scale ? 1.0 / double(c.head_dim) : c.attn_scale);
  ap.window = c.layers[size_t(l)].sliding_window;
  ap.drop_newest = s.faults.kv_off_by_one, ap.gqa_modulo = s.faults.gqa_mapping;
  ap.softmax_no_max = s.faults.softmax_no_max, ap.whole_chunk = s.faults.causal_mask;
  float *q = as<float>(s.q), *k = as<float>(s.k), *v = as<float>(s.v), *att = as<float>(s.att);
  for (const Segment& g : p.segs) {
    CudaSession& o = *g.s;
    const size_t layer_kv = size_t(o.max_ctx) * kv_dim, r0 = size_t(g.row0);
    float* kc = as<float>(o.k_cache) + size_t(l) * layer_kv;
    float* vc = as<float>(o.v_cache) + size_t(l) * layer_kv;
    rp.rope_origin = g.rope_origin;
    rp.max_ctx = o.max_ctx;
    check_launch(launch_rope_store(q + r0 * q_dim, k + r0 * kv_dim, v + r0 * kv_dim, kc, vc,
                                   o.layer_rope[size_t(l)], g.d_params, g.n, rp, s.stream),
                 "rope_store");
    ap.n_split = g.n == 1 ? kDecodeSplits : kPrefillSplits;
    check_launch(launch_attention(q + r0 * q_dim, kc, vc, as<float>(s.partial), att + r0 * q_dim,
                                  g.d_params, g.n, ap, s.stream),
                 "attention");
  }
}

// Attention half of layer l over the pass's rows: x += attn(norm(x)) is left
// pending (the block output in s.tmp; the next add_rmsnorm adds it).
void attention_block(CudaSession& s, int l, const Pass& p) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevLayer& L = s.w->layers[size_t(l)];
  const double eps = c.rms_norm_eps * s.faults.rms_eps_scale;
  const int hd = c.head_dim, n = p.n;
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  float *q = as<float>(s.q), *k = as<float>(s.k), *v = as<float>(s.v);
  check_launch(
      launch_add_rmsnorm(x, l == 0 ? nullptr : tmp, L.attn_norm, xn, n, c.n_embd, eps, s.stream),
      "add_rmsnorm");
  if (l > 0) tap(s, p, l - 1, TS_TAP_RESIDUAL, x);
  linear_bias(s, L.wq, L.bq, xn, q, n);
  linear_bias(s, L.wk, L.bk, xn, k, n);
  linear_bias(s, L.wv, L.bv, xn, v, n);
  if (L.q_norm) {  // per-head RMSNorm of q and k (in place)
    check_launch(launch_add_rmsnorm(q, nullptr, L.q_norm, q, n * c.n_head, hd, eps, s.stream),
                 "q_norm");
    check_launch(launch_add_rmsnorm(k, nullptr, L.k_norm, k, n * c.n_head_kv, hd, eps, s.stream),
                 "k_norm");
  }
  attend_segments(s, l, p);
  linear(s, L.wo, as<float>(s.att), tmp, n);
  if (L.post_attn_norm) {
    check_launch(
        launch_add_rmsnorm(tmp, nullptr, L.post_attn_norm, tmp, n, c.n_embd, eps, s.stream),
        "post_attn_norm");
  }
  tap(s, p, l, TS_TAP_ATTN_OUT, tmp);
}

// FFN half of layer l: adds the pending attention output to x, leaves the FFN
// output pending in s.tmp.
void ffn_block(CudaSession& s, int l, const Pass& p) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevLayer& L = s.w->layers[size_t(l)];
  const double eps = c.rms_norm_eps * s.faults.rms_eps_scale;
  const int n = p.n;
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  check_launch(launch_add_rmsnorm(x, tmp, L.ffn_norm, xn, n, c.n_embd, eps, s.stream),
               "add_rmsnorm");
  linear(s, L.gate, xn, as<float>(s.gate), n);
  linear(s, L.up, xn, as<float>(s.up), n);
  const bool gelu = c.ffn_activation == touchstone::FfnActivation::GeluTanh;
  check_launch(
      launch_gated_act(as<float>(s.gate), as<float>(s.up), int64_t{n} * c.n_ff, gelu, s.stream),
      "gated_act");
  linear(s, L.down, as<float>(s.gate), tmp, n);
  if (L.post_ffn_norm) {
    check_launch(launch_add_rmsnorm(tmp, nullptr, L.post_ffn_norm, tmp, n, c.n_embd, eps, s.stream),
                 "post_ffn_norm");
  }
  tap(s, p, l, TS_TAP_FFN_OUT, tmp);
}

// The LM head's input: the normed rows that need logits, in the segments'
// order. One range of s.xn is read in place (one session's call: its last row,
// or all rows); otherwise the ranges are gathered into s.tmp, free once the
// final add_rmsnorm has added the pending FFN output.
const float* head_input(CudaSession& s, const Pass& p) {
  const size_t d = size_t(s.model->cfg.n_embd);
  const float* xn = as<float>(s.xn);
  int first = -1, next = -1;
  bool one_range = true;
  for (const Segment& g : p.segs) {
    if (g.out_rows == 0) continue;
    const int src = g.row0 + g.n - g.out_rows;
    if (first < 0) first = src;
    if (next >= 0 && src != next) one_range = false;
    next = src + g.out_rows;
  }
  if (one_range) return xn + size_t(first) * d;
  float* dst = as<float>(s.tmp);
  for (const Segment& g : p.segs) {
    if (g.out_rows == 0) continue;
    const size_t src = size_t(g.row0 + g.n - g.out_rows);
    TS_CUDA(cudaMemcpyAsync(dst + size_t(g.out_row0) * d, xn + src * d,
                            size_t(g.out_rows) * d * sizeof(float), cudaMemcpyDeviceToDevice,
                            s.stream));
  }
  return dst;
}

}  // namespace

void enqueue_pass(CudaSession& s, const Pass& p) {
  const touchstone::ModelConfig& c = s.model->cfg;
  const DevWeights& w = *s.w;
  const int d = c.n_embd, n = p.n;
  float *x = as<float>(s.x), *xn = as<float>(s.xn), *tmp = as<float>(s.tmp);
  check_launch(
      launch_get_rows(w.tok_embd.type, w.tok_embd.ptr, p.d_tokens, n, d, c.embd_scale, x, s.stream),
      "get_rows");
  const int n_layer = s.faults.last_layer_skipped ? c.n_layer - 1 : c.n_layer;
  for (int l = 0; l < n_layer; ++l) {
    attention_block(s, l, p);
    ffn_block(s, l, p);
  }
  check_launch(launch_add_rmsnorm(x, n_layer > 0 ? tmp : nullptr, w.out_norm, xn, n, d,
                                  c.rms_norm_eps * s.faults.rms_eps_scale, s.stream),
               "add_rmsnorm");
  for (int l = std::max(n_layer - 1, 0); l < c.n_layer; ++l) {
    // a skipped layer (fault) adds nothing: zero block outputs, residual unchanged
    if (l >= n_layer) {
      tap(s, p, l, TS_TAP_ATTN_OUT, nullptr);
      tap(s, p, l, TS_TAP_FFN_OUT, nullptr);
    }
    tap(s, p, l, TS_TAP_RESIDUAL, x);
  }
  if (p.out_rows > 0) {
    linear(s, w.lm_head, head_input(s, p), as<float>(s.logits), p.out_rows);
    if (c.final_logit_softcap != 0.0) {
      check_launch(launch_softcap(as<float>(s.logits), int64_t{p.out_rows} * c.n_vocab,
                                  c.final_logit_softcap, s.stream),
                   "softcap");
    }
  }
  for (const Segment& g : p.segs)
    if (g.tap) g.s->taps_recorded = true;
}

void enqueue_forward(CudaSession& s, int n, Logits mode, int rope_origin) {
  Segment g;
  g.s = &s;
  g.n = n;
  g.d_params = as<int32_t>(s.params);
  g.rope_origin = rope_origin;
  g.out_rows = mode == Logits::All ? n : (mode == Logits::Last ? 1 : 0);
  g.tap = s.taps_on;  // every call records its last row
  const Pass p{std::span<const Segment>(&g, 1), n, g.out_rows, as<int32_t>(s.params) + 2};
  enqueue_pass(s, p);
}

}  // namespace touchstone::cuda
