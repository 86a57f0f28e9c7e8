// reference_forward.cpp - the scalar reference forward pass, every family, in one file.
//
// The model is data (ModelConfig, touchstone/model/model_config.h); this one pass follows
// it. Formulas follow Hugging Face transformers (modeling_llama.py, modeling_qwen2.py,
// modeling_qwen3.py, modeling_gemma3.py, modeling_phi3.py, modeling_mixtral.py,
// modeling_qwen3_moe.py, modeling_gpt_oss.py). The FFN is in reference_ffn.cpp.
//   x   = token_embd[token] * embd_scale                        (Gemma: sqrt(n_embd))
//   for each layer l (LayerConfig: RoPE base/scale, sliding window):
//     h     = RMSNorm(x) * attn_norm
//     q,k,v = Wq h + bq, Wk h + bk, Wv h + bv                   (biases: Qwen2, gpt-oss)
//     q_h   = RMSNorm(q_h) * q_norm, k_h likewise, per head     (QK-norm: Qwen3, Gemma 3)
//     RoPE(q_h), RoPE(k_h) at this position (interleaved or NeoX, first n_rot dims;
//       YaRN frequencies and mscale for gpt-oss, touchstone/model/rope_yarn.h)
//     append k, v to the KV cache
//     per query head h (GQA: it reads KV head h / (n_head / n_head_kv)):
//        s_t = q_h . k_t * attn_scale for t in [max(0, pos - W + 1), pos] (W = 0: from 0)
//        p = softmax(s);  o_h = sum_t p_t v_t
//          (sinks, gpt-oss: p_t = exp(s_t - m) / (sum_t exp(s_t - m) + exp(sink_h - m)),
//           m = max(max_t s_t, sink_h))
//     a   = Wo o + bo;  a = RMSNorm(a) * post_attn_norm         (bo: gpt-oss; post-norms: Gemma 3)
//     x  += a
//     h   = RMSNorm(x) * ffn_norm
//     f   = Wdown (act(Wgate h) * (Wup h));  act = SiLU (SwiGLU) or tanh-GELU (GeGLU)
//       mixture of experts (Mixtral, Qwen3-MoE; touchstone/model/moe_router.h):
//       r = Wrouter h;  (e, w_e) for e in S = route_softmax_top_k(r, k, renormalise)
//       f = sum_{e in S} w_e * Wdown_e (act(Wgate_e h) * (Wup_e h))
//       gpt-oss: r = Wrouter h + br;  S, w = route_top_k_softmax(r, k);
//       f = sum_{e in S} w_e * (Wdown_e swiglu_oai(Wgate_e h + bg_e, Wup_e h + bu_e) + bd_e)
//     f   = RMSNorm(f) * post_ffn_norm                          (post-norms: Gemma 3)
//     x  += f
//   logits = W_lm_head (RMSNorm(x) * output_norm);  cap * tanh(logits / cap) if soft-capped
//
// Numerics (the "documented accumulation order", see touchstone/model/scalar_ops.h):
//   - Weights are read as stored in the GGUF file, a matrix row dequantized to fp32 (the
//     reference dequantizer, ggml's formulas) just before its dot product; activations
//     are stored in fp32.
//   - Every reduction (dot products, RMSNorm mean square, attention scores,
//     softmax sums, attention weighted sums) accumulates in fp64; dot products in
//     the four-partial-sum order of ops::dot, other sums in increasing index.
//     A bias is added to the fp64 dot product before the single rounding to fp32.
//   - Elementwise maths (rsqrt, exp, sin/cos, SiLU, GELU, tanh) are done in fp64
//     and the result is rounded once to fp32 when stored.
//   - Matrix rows are split across the threads of a RowPool but a row is never split, so
//     results are bitwise identical for any thread count and across runs.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "reference_ops.h"
#include "touchstone/common/error.h"
#include "touchstone/model/rope_yarn.h"
#include "touchstone/model/scalar_ops.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
using reference_ops::add_into;
using reference_ops::matvec;

namespace {
const float* or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
}  // namespace

ReferenceTransformer::ReferenceTransformer(const StoredWeights& weights, int32_t max_context,
                                           int n_threads, Faults faults)
    : w_(weights), faults_(faults), n_threads_(n_threads), pool_(n_threads) {
  const ModelConfig& c = w_.config;
  max_ctx_ = max_context > 0 ? max_context : c.n_ctx_train;
  if (faults_.session_order_reduction) {
    // The fault: the split depends on how many sessions this process opened
    // (a stand-in for a scheduling-dependent reduction order).
    static std::atomic<int> sessions{0};
    faults_.session_slices = 2 + sessions.fetch_add(1) % 16;
  }
  const size_t kv_dim = size_t(c.n_head_kv) * size_t(c.head_dim);
  const size_t kv_floats = size_t(c.n_layer) * size_t(max_ctx_) * kv_dim;
  k_cache_.reset(static_cast<float*>(std::calloc(kv_floats, sizeof(float))));
  v_cache_.reset(static_cast<float*>(std::calloc(kv_floats, sizeof(float))));
  if (!k_cache_ || !v_cache_) throw std::bad_alloc();
  x_.resize(size_t(c.n_embd));
  xn_.resize(size_t(c.n_embd));
  q_.resize(size_t(c.n_head) * size_t(c.head_dim));
  k_.resize(kv_dim);
  v_.resize(kv_dim);
  att_out_.resize(q_.size());
  const int32_t n_ff = std::max({c.n_ff, c.moe.n_ff_exp, c.moe.n_ff_shexp});
  gate_.resize(size_t(n_ff));
  up_.resize(size_t(n_ff));
  scores_.resize(size_t(max_ctx_));
  if (c.is_moe()) {
    router_.resize(size_t(c.moe.n_expert));
    expert_out_.resize(size_t(c.n_embd));
    moe_sum_.resize(size_t(c.n_embd));
  }
}

void ReferenceTransformer::set_taps(bool enable) {
  taps_on_ = enable;
  taps_.clear();
}

void ReferenceTransformer::rewind(int32_t p) {
  if (p < 0 || p > pos_) throw Error("rewind to position {} outside [0, {}]", p, pos_);
  pos_ = p;  // entries >= p are overwritten by later tokens and never read before then
  // rewind_noop fault: the attended length is not truncated (kv_len_ keeps its
  // high-water mark), so the stale entries in [p, kv_len_) are read again.
  if (!faults_.rewind_noop) kv_len_ = p;
}

void ReferenceTransformer::prefill(std::span<const int32_t> tokens, bool all_positions,
                                   std::span<float> logits) {
  prefill_in_batch(tokens, all_positions, logits, BatchFaults{});
}

// prefill() with the step_batch faults of one entry (BatchFaults{} = none).
void ReferenceTransformer::prefill_in_batch(std::span<const int32_t> tokens, bool all_positions,
                                            std::span<float> logits, const BatchFaults& batch) {
  const auto n = int32_t(tokens.size());
  const size_t v = size_t(n_vocab());
  if (n < 1) throw Error("prefill of no tokens");
  const size_t want = all_positions ? size_t(n) * v : v;
  if (logits.size() != want) {
    throw Error("prefill: logits buffer holds {} floats, expected {}", logits.size(), want);
  }
  // The per-call fault state is cleared however the call ends.
  struct Clear {
    ReferenceTransformer& r;
    ~Clear() {
      r.chunk_end_ = 0;
      r.rope_origin_ = 0;
      r.leak_from_ = nullptr;
      r.faults_.batch_slices = 0;
    }
  } clear{*this};
  const int32_t p0 = pos_;
  if (faults_.causal_mask && n > 1) {
    // The causal_mask fault: one token at a time, the reference has no chunk to
    // mask. A first, causal pass fills the chunk's KV entries; the second pass
    // then lets every position also attend to the chunk's later entries.
    std::vector<float> scratch(v);
    for (int32_t t : tokens) forward(t, scratch);
    rewind(p0);
    chunk_end_ = p0 + n;
  }
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (their K/V still go to the right slots).
  // batch_position_offset fault: shifted by the batch's earlier tokens.
  rope_origin_ = (faults_.prefill_position_reset && n > 1 ? p0 : 0) - batch.rope_offset;
  leak_from_ = batch.leak_from;
  faults_.batch_slices = batch.slices;
  for (int32_t i = 0; i < n; ++i) {
    forward(tokens[size_t(i)], logits.subspan(all_positions ? size_t(i) * v : 0, v));
  }
  // logits_row_shift fault: row i holds row i-1. verify_row_shift fault: the
  // same, only for a prefill continuing a sequence (a speculative verify).
  const bool shift = faults_.logits_row_shift || (faults_.verify_row_shift && p0 > 0);
  if (shift && all_positions && n > 1)
    std::memmove(logits.data() + v, logits.data(), size_t(n - 1) * v * sizeof(float));
}

void ReferenceTransformer::step_batch(std::span<const BatchEntry> entries) {
  int64_t total = 0;  // tokens of the whole call
  for (size_t i = 0; i < entries.size(); ++i) {
    const ReferenceTransformer* r = entries[i].ref;
    if (!r) throw Error("step_batch: entry {}: no transformer", i);
    if (&r->w_ != &entries[0].ref->w_) {
      throw Error("step_batch: entry {}: other weights than entry 0's", i);
    }
    for (size_t j = 0; j < i; ++j) {
      if (entries[j].ref == r) throw Error("step_batch: entry {}: same transformer as {}", i, j);
    }
    // Checked before any entry runs, so a refused call changes no transformer.
    const size_t n = entries[i].tokens.size();
    const size_t rows = entries[i].all_positions ? n : 1;
    if (n < 1 || entries[i].logits.size() != rows * size_t(r->n_vocab()) ||
        int64_t(r->pos_) + int64_t(n) > int64_t(r->max_ctx_)) {
      throw Error("step_batch: entry {}: no tokens, a logits buffer of the wrong size or no room",
                  i);
    }
    total += int64_t(n);
  }
  int32_t before = 0;  // tokens of the entries before entry i
  for (size_t i = 0; i < entries.size(); ++i) {
    const BatchEntry& e = entries[i];
    const Faults& f = e.ref->faults_;
    BatchFaults batch;
    // batch_token_count_split: the split point follows the call's token count.
    if (f.batch_token_count_split) batch.slices = 2 + int(total % 16);
    // batch_position_offset: positions numbered as if the entries were one flat sequence.
    if (f.batch_position_offset) batch.rope_offset = before;
    // batch_kv_leak: the previous entry's newest KV entry is attended too.
    if (f.batch_kv_leak && i > 0) batch.leak_from = entries[i - 1].ref;
    e.ref->prefill_in_batch(e.tokens, e.all_positions, e.logits, batch);
    before += int32_t(e.tokens.size());
  }
}

std::unique_ptr<ReferenceTransformer> ReferenceTransformer::fork(int32_t n_prefix) const {
  auto out = std::make_unique<ReferenceTransformer>(w_, max_ctx_, n_threads_, faults_);
  out->copy_prefix(*this, n_prefix);
  return out;
}

void ReferenceTransformer::copy_prefix(const ReferenceTransformer& src, int32_t n_prefix) {
  if (&src == this) throw Error("copy_prefix: the source is this transformer");
  if (&src.w_ != &w_) throw Error("copy_prefix: the source computes with other weights");
  if (n_prefix < 0 || n_prefix > src.pos_ || n_prefix > max_ctx_) {
    throw Error("copy_prefix: n_prefix {} outside [0, min(source position {}, max context {})]",
                n_prefix, src.pos_, max_ctx_);
  }
  const size_t kv_dim = size_t(w_.config.n_head_kv) * size_t(w_.config.head_dim);
  // fork_short_copy fault: the prefix's last row is not copied and stays zero.
  const int32_t rows = faults_.fork_short_copy ? std::max(0, n_prefix - 1) : n_prefix;
  const size_t copied = size_t(rows) * kv_dim, zeroed = size_t(n_prefix - rows) * kv_dim;
  for (int32_t l = 0; l < w_.config.n_layer; ++l) {
    std::memcpy(k_layer(l), src.k_layer(l), copied * sizeof(float));
    std::memcpy(v_layer(l), src.v_layer(l), copied * sizeof(float));
    std::memset(k_layer(l) + copied, 0, zeroed * sizeof(float));
    std::memset(v_layer(l) + copied, 0, zeroed * sizeof(float));
  }
  pos_ = n_prefix;
  kv_len_ = n_prefix;
}

float* ReferenceTransformer::k_layer(int32_t l) const {
  const size_t kv_dim = size_t(w_.config.n_head_kv) * size_t(w_.config.head_dim);
  return k_cache_.get() + size_t(l) * size_t(max_ctx_) * kv_dim;
}

float* ReferenceTransformer::v_layer(int32_t l) const {
  const size_t kv_dim = size_t(w_.config.n_head_kv) * size_t(w_.config.head_dim);
  return v_cache_.get() + size_t(l) * size_t(max_ctx_) * kv_dim;
}

std::span<const float> ReferenceTransformer::k_row(int32_t l, int32_t p) const {
  if (l < 0 || l >= w_.config.n_layer || p < 0 || p >= max_ctx_)
    throw Error("k_row: layer {} position {} out of range", l, p);
  const size_t kv_dim = size_t(w_.config.n_head_kv) * size_t(w_.config.head_dim);
  return {k_layer(l) + size_t(p) * kv_dim, kv_dim};
}

std::span<const float> ReferenceTransformer::v_row(int32_t l, int32_t p) const {
  if (l < 0 || l >= w_.config.n_layer || p < 0 || p >= max_ctx_)
    throw Error("v_row: layer {} position {} out of range", l, p);
  const size_t kv_dim = size_t(w_.config.n_head_kv) * size_t(w_.config.head_dim);
  return {v_layer(l) + size_t(p) * kv_dim, kv_dim};
}

// Attention block of layer l at position pos: reads x_, adds the block's output to x_.
void ReferenceTransformer::attention(int32_t l, int32_t pos) {
  attention_qkv(l, pos);
  attention_out(l, pos, 0);
}

// The attention block's first half at position pos: x_ normed, q_, k_, v_ projected
// (QK-norm, RoPE), K and V written to the cache row pos.
void ReferenceTransformer::attention_qkv(int32_t l, int32_t pos) {
  const ModelConfig& c = w_.config;
  const LayerConfig& lc = c.layers[size_t(l)];
  const StoredLayerWeights& L = w_.layers[size_t(l)];
  const int64_t d = c.n_embd, hd = c.head_dim;
  const int64_t kv_dim = int64_t{c.n_head_kv} * hd;
  const double eps = c.rms_norm_eps * faults_.rms_eps_scale;

  ops::rms_norm(x_.data(), L.attn_norm.data(), xn_.data(), d, eps);
  matvec(pool_, L.wq, xn_.data(), q_.data(), faults_, or_null(L.bq));
  matvec(pool_, L.wk, xn_.data(), k_.data(), faults_, or_null(L.bk));
  matvec(pool_, L.wv, xn_.data(), v_.data(), faults_, or_null(L.bv));
  if (c.qk_norm) {
    for (int32_t h = 0; h < c.n_head; ++h)
      ops::rms_norm(q_.data() + h * hd, L.q_norm.data(), q_.data() + h * hd, hd, eps);
    for (int32_t h = 0; h < c.n_head_kv; ++h)
      ops::rms_norm(k_.data() + h * hd, L.k_norm.data(), k_.data() + h * hd, hd, eps);
  }
  const double base = lc.rope_base * faults_.rope_base_scale;
  const float* ff = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.data();
  const bool neox = (c.rope_style == RopeStyle::NeoX) != faults_.rope_layout;
  auto rope = neox ? ops::rope_neox : ops::rope_interleaved;
  const int32_t rope_pos = pos - rope_origin_;  // 0 origin unless a fault sets one
  if (c.rope_yarn.factor != 0.0) {              // gpt-oss: YaRN frequencies and mscale
    const ops::YarnFrequencies fr = ops::yarn_frequencies(c.rope_yarn, c.n_rot, base);
    for (int32_t h = 0; h < c.n_head; ++h)
      ops::rope_with_frequencies(q_.data() + h * hd, c.n_rot, rope_pos, fr, neox);
    for (int32_t h = 0; h < c.n_head_kv; ++h)
      ops::rope_with_frequencies(k_.data() + h * hd, c.n_rot, rope_pos, fr, neox);
  } else {
    for (int32_t h = 0; h < c.n_head; ++h)
      rope(q_.data() + h * hd, c.n_rot, rope_pos, base, lc.rope_scale, ff);
    for (int32_t h = 0; h < c.n_head_kv; ++h)
      rope(k_.data() + h * hd, c.n_rot, rope_pos, base, lc.rope_scale, ff);
  }
  // kv_write_next fault: the entry goes to pos + 1 (dropped at the cache's end).
  const int32_t at = faults_.kv_write_next ? pos + 1 : pos;
  if (at < max_ctx_) {
    std::memcpy(k_layer(l) + size_t(at) * size_t(kv_dim), k_.data(),
                size_t(kv_dim) * sizeof(float));
    std::memcpy(v_layer(l) + size_t(at) * size_t(kv_dim), v_.data(),
                size_t(kv_dim) * sizeof(float));
  }
}

// The second half: the query in q_ attends, the output projection's result is added to
// x_ (and left in xn_). visible_end > 0: the keys before it are visible too (an
// image block attended bidirectionally, prefill_embeddings).
void ReferenceTransformer::attention_out(int32_t l, int32_t pos, int32_t visible_end) {
  const ModelConfig& c = w_.config;
  const LayerConfig& lc = c.layers[size_t(l)];
  const StoredLayerWeights& L = w_.layers[size_t(l)];
  const int64_t d = c.n_embd;
  const double eps = c.rms_norm_eps * faults_.rms_eps_scale;
  // Positions attended: [t0, pos] (causal; a sliding window W keeps the last W).
  // Faults: kv_off_by_one drops the newest entry; rewind_noop also reads stale
  // entries up to kv_len_; causal_mask reads up to the prefill chunk's end.
  int32_t n_kv = (faults_.kv_off_by_one && pos > 0) ? pos : pos + 1;
  if (faults_.rewind_noop) n_kv = std::max(n_kv, kv_len_);
  if (faults_.causal_mask) n_kv = std::max(n_kv, std::min(chunk_end_, max_ctx_));
  n_kv = std::max(n_kv, std::min(visible_end, max_ctx_));
  const int32_t t0 = lc.sliding_window > 0 ? std::max(0, pos - lc.sliding_window + 1) : 0;
  for (int32_t h = 0; h < c.n_head; ++h) attend_head(l, h, t0, n_kv);
  matvec(pool_, L.wo, att_out_.data(), xn_.data(), faults_, or_null(L.bo));
  if (c.post_norms) ops::rms_norm(xn_.data(), L.post_attn_norm.data(), xn_.data(), d, eps);
  add_into(x_, xn_, d);
}

// Query head h of layer l (in q_) attends KV entries [t0, n_kv); writes its
// slice of att_out_. batch_kv_leak fault: when leak_from_ is set, that
// transformer's newest KV entry of layer l is attended too, first, as if it
// were the entry before t0.
void ReferenceTransformer::attend_head(int32_t l, int32_t h, int32_t t0, int32_t n_kv) {
  const ModelConfig& c = w_.config;
  const int64_t hd = c.head_dim, kv_dim = int64_t{c.n_head_kv} * hd;
  const int32_t group = c.n_head / c.n_head_kv;  // query heads per KV head (GQA)
  const float* k_l = k_layer(l);
  const float* v_l = v_layer(l);
  const double scale = faults_.attention_scale ? 1.0 / double(hd) : c.attn_scale;
  const float* qh = q_.data() + h * hd;
  const int64_t kv_off = int64_t{faults_.gqa_mapping ? h % c.n_head_kv : h / group} * hd;
  const float *leak_k = nullptr, *leak_v = nullptr;
  if (leak_from_) {
    const size_t row = size_t(leak_from_->pos_ - 1) * size_t(kv_dim);
    leak_k = leak_from_->k_layer(l) + row + kv_off;
    leak_v = leak_from_->v_layer(l) + row + kv_off;
  }
  // Attention sink (gpt-oss): a learned logit per head that joins the softmax's
  // denominator and attends to nothing (HF eager_attention_forward: cat([scores, sinks]),
  // max subtracted, softmax, the sink column dropped; llama.cpp ggml_soft_max_add_sinks).
  // attention_sinks_ignored fault: the sink left out, as a backend without sinks.
  const std::vector<float>& sinks = w_.layers[size_t(l)].sinks;
  const bool has_sink = !sinks.empty() && !faults_.attention_sinks_ignored;
  const double sink = has_sink ? double{sinks[size_t(h)]} : -INFINITY;
  double max_s = sink, leak_s = 0.0;
  if (leak_k) {
    leak_s = ops::dot(qh, leak_k, hd) * scale;
    max_s = std::max(max_s, leak_s);
  }
  for (int32_t t = t0; t < n_kv; ++t) {
    scores_[size_t(t)] = ops::dot(qh, k_l + int64_t{t} * kv_dim + kv_off, hd) * scale;
    max_s = std::max(max_s, scores_[size_t(t)]);
  }
  // softmax_no_max fault: exp(s) in fp32 without subtracting the max (inf
  // once a score exceeds ~88.7, then inf/inf = NaN).
  if (faults_.softmax_no_max) max_s = 0.0;
  auto weight = [&](double score) {
    return faults_.softmax_no_max ? double{std::exp(static_cast<float>(score))}
                                  : std::exp(score - max_s);
  };
  double sum = has_sink ? weight(sink) : 0.0;
  if (leak_k) sum += leak_s = weight(leak_s);
  for (int32_t t = t0; t < n_kv; ++t) {
    scores_[size_t(t)] = weight(scores_[size_t(t)]);
    sum += scores_[size_t(t)];
  }
  for (int64_t i = 0; i < hd; ++i) {
    double acc = leak_v ? leak_s * double{leak_v[i]} : 0.0;
    for (int32_t t = t0; t < n_kv; ++t) {
      acc += scores_[size_t(t)] * double{v_l[int64_t{t} * kv_dim + kv_off + i]};
    }
    att_out_[size_t(h * hd + i)] = static_cast<float>(acc / sum);
  }
}

void ReferenceTransformer::forward(int32_t token, std::span<float> logits) {
  const ModelConfig& c = w_.config;
  if (token < 0 || token >= c.n_vocab) {
    throw Error("token id {} at position {} outside [0, {})", token, pos_, c.n_vocab);
  }
  if (pos_ >= max_ctx_) throw Error("KV cache full: position {} >= max context {}", pos_, max_ctx_);
  if (logits.size() != size_t(c.n_vocab)) {
    throw Error("logits buffer holds {} floats, n_vocab is {}", logits.size(), c.n_vocab);
  }
  const int64_t d = c.n_embd;
  const float* e = w_.token_embd.row(token, xn_.data());  // xn_ is free until the first norm
  for (int64_t i = 0; i < d; ++i) x_[size_t(i)] = static_cast<float>(double{e[i]} * c.embd_scale);

  std::vector<float> taps;
  if (taps_on_) taps.resize(size_t(c.n_layer) * kTapPoints * size_t(d));
  const int32_t n_layer = faults_.last_layer_skipped ? c.n_layer - 1 : c.n_layer;
  for (int32_t l = 0; l < n_layer; ++l) {
    float* tap = taps_on_ ? taps.data() + size_t(l) * kTapPoints * size_t(d) : nullptr;
    attention(l, pos_);  // leaves the block output in xn_
    if (tap) std::copy(xn_.begin(), xn_.begin() + d, tap);
    feed_forward(l);
    if (tap) {
      std::copy(xn_.begin(), xn_.begin() + d, tap + d);
      std::copy(x_.begin(), x_.begin() + d, tap + 2 * d);
    }
  }
  if (taps_on_) {
    // A skipped layer (fault) adds nothing: zero block outputs, residual unchanged.
    for (int32_t l = n_layer; l < c.n_layer; ++l)
      std::copy(x_.begin(), x_.begin() + d,
                taps.begin() + (size_t(l) * kTapPoints + 2) * size_t(d));
    taps_ = std::move(taps);
  }

  finish_position(logits);
}

// The position's logits from the residual stream in x_ (output norm, LM head,
// soft-capping, the logit-noise fault); then the position advances.
void ReferenceTransformer::finish_position(std::span<float> logits) {
  const ModelConfig& c = w_.config;
  const int64_t d = c.n_embd;
  ops::rms_norm(x_.data(), w_.output_norm.data(), xn_.data(), d,
                c.rms_norm_eps * faults_.rms_eps_scale);
  matvec(pool_, w_.lm_head(), xn_.data(), logits.data(), faults_);
  if (c.final_logit_softcap != 0.0) {
    for (float& v : logits) v = static_cast<float>(ops::softcap(v, c.final_logit_softcap));
  }
  if (faults_.logit_noise != 0.0) {
    const uint64_t base = uint64_t(pos_) * uint64_t(c.n_vocab);
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = static_cast<float>(double{logits[i]} *
                                     (1.0 + faults_.logit_noise * fault_noise_sign(base + i)));
    }
  }
  ++pos_;
  kv_len_ = std::max(kv_len_, pos_);
}

}  // namespace touchstone
