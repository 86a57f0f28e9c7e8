// engine_attention.cpp - attention of a forward pass's tokens, each against
// its own session's KV cache (a pass may hold several sessions: step_batch).
// Grouped tasks (attend_multi_f32) or per (token, head) tasks (attend_f32):
// the same bits (kernels.h); the faults that change which rows a query reads
// take the per-head path.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine.h"

namespace touchstone::cpu_simd {

float* SimdSession::k_rows(int32_t layer) const {
  return kv_->k + size_t(layer) * size_t(max_ctx_) * size_t(c_.n_head_kv) * size_t(c_.head_dim);
}

float* SimdSession::v_rows(int32_t layer) const {
  return kv_->v + size_t(layer) * size_t(max_ctx_) * size_t(c_.n_head_kv) * size_t(c_.head_dim);
}

void SimdSession::reserve_scores(int32_t ctx) {
  if (ctx <= scores_ctx_) return;
  scores_ctx_ = ctx;
  scores_.resize(size_t(pool_.size()) * size_t(ctx + 1));  // + 1: batch_kv_leak's extra row
  // Not value-initialized: pages are touched only as far as the context reaches.
  multi_scores_.reset(new float[size_t(pool_.size()) * attn_queries() * size_t(ctx)]);
}

// Queries per multi-query attention task: the GQA group's heads for enough
// consecutive tokens to make about 12 (full register tiles for groups 1-4);
// 0 when the group alone is over kMaxAttnQueries (per-head tasks then).
size_t SimdSession::attn_queries() const {
  const size_t group = size_t(c_.n_head / c_.n_head_kv);
  if (group > kMaxAttnQueries) return 0;
  return group * std::max<size_t>(1, 12 / group);
}

void SimdSession::attention(int32_t layer) {
  // Faults that change which rows a query attends, or how, keep the per-head path.
  // A bidirectional block (ABI v8 image) reads past its own row: the per-head path too.
  const bool other_rows = std::any_of(segs_, segs_ + n_segs_, [](const Seg& g) {
    return g.leak || g.page_from || g.bidirectional;
  });
  const bool faulty = faults_.softmax_no_max || faults_.gqa_mapping || faults_.kv_off_by_one ||
                      faults_.rewind_noop || faults_.causal_mask || other_rows;
  const size_t nq = attn_queries(), n_tasks = blocks_.size() * size_t(c_.n_head_kv);
  // Same bits either way: the grouped tasks only when they keep every thread busy.
  if (!faulty && nq && n_tasks >= size_t(pool_.size()))
    attention_grouped(layer);
  else
    attention_per_head(layer);
}

// One task per (block of one segment's tokens, KV head): its tokens x the
// group's query heads in one attend_multi_f32 call (each K / V row loaded once
// per register tile).
void SimdSession::attention_grouped(int32_t layer) {
  const size_t hd = size_t(c_.head_dim), kvd = size_t(c_.n_head_kv) * hd,
               qd = size_t(c_.n_head) * hd, n_kvh = size_t(c_.n_head_kv);
  const size_t group = size_t(c_.n_head / c_.n_head_kv);
  const int32_t window = c_.layers[size_t(layer)].sliding_window;
  // gpt-oss: [n_head], else null; none with the attention_sinks_ignored fault
  const float* sinks = faults_.attention_sinks_ignored ? nullptr : w_->layers[size_t(layer)].sinks;
  const float scale =
      static_cast<float>(faults_.attention_scale ? 1.0 / double(hd) : c_.attn_scale);
  pool_.run(blocks_.size() * n_kvh, [&](size_t task, int thread) {
    const Block& b = blocks_[task / n_kvh];
    const Seg& g = segs_[b.seg];
    const size_t kvh = task % n_kvh;
    const float* q[kMaxAttnQueries];
    float* out[kMaxAttnQueries];
    float sink[kMaxAttnQueries];
    size_t t0[kMaxAttnQueries], t1[kMaxAttnQueries], G = 0;
    for (int32_t i = b.i0; i < b.i1; ++i) {
      const int32_t p = g.pos + (i - g.first);  // attends [t0, p] (sliding window: the last W)
      for (size_t h = kvh * group; h < (kvh + 1) * group; ++h, ++G) {
        q[G] = q_.data() + size_t(i) * qd + h * hd;
        out[G] = att_.data() + size_t(i) * qd + h * hd;
        if (sinks) sink[G] = sinks[h];
        t0[G] = size_t(window > 0 ? std::max(0, p - window + 1) : 0);
        t1[G] = size_t(p) + 1;
      }
    }
    // query g's scores at s + g * (pos + n): >= its row count
    float* s = multi_scores_.get() + size_t(thread) * attn_queries() * size_t(scores_ctx_);
    attend_multi_f32(G, q, g.s->k_rows(layer) + kvh * hd, g.s->v_rows(layer) + kvh * hd, kvd, hd,
                     t0, t1, scale, s, size_t(g.pos + g.n), out, sinks ? sink : nullptr);
  });
}

namespace {

// Softmax attention of one head over rows [0, m) of K / V (stride ld) plus
// `extra` further rows given by pointer (the batch_kv_leak fault), fp32,
// max-subtracted; without the max when no_max (softmax_no_max fault). The sink
// logit (gpt-oss; -inf: none) joins the maximum and the sum.
void attend_rows(const float* q, const float* K, const float* V, size_t ld, size_t hd, size_t m,
                 const float* const* xk, const float* const* xv, size_t extra, float scale,
                 bool no_max, float sink, float* s, float* out) {
  const size_t n = m + extra;
  float mx = sink;
  for (size_t t = 0; t < n; ++t) {
    s[t] = dot_f32(q, t < m ? K + t * ld : xk[t - m], hd) * scale;
    mx = std::max(mx, s[t]);
  }
  const bool has_sink = sink != -std::numeric_limits<float>::infinity();
  float sum = has_sink ? std::exp(no_max ? sink : sink - mx) : 0.0f;
  for (size_t t = 0; t < n; ++t) sum += (s[t] = std::exp(no_max ? s[t] : s[t] - mx));
  std::fill(out, out + hd, 0.0f);
  for (size_t t = 0; t < n; ++t) axpy_f32(s[t] / sum, t < m ? V + t * ld : xv[t - m], out, hd);
}

}  // namespace

void SimdSession::attention_per_head(int32_t layer) {
  const size_t hd = size_t(c_.head_dim), kvd = size_t(c_.n_head_kv) * hd,
               qd = size_t(c_.n_head) * hd;
  const int32_t group = c_.n_head / c_.n_head_kv;
  const int32_t window = c_.layers[size_t(layer)].sliding_window;
  // gpt-oss: [n_head], else null; none with the attention_sinks_ignored fault
  const float* sinks = faults_.attention_sinks_ignored ? nullptr : w_->layers[size_t(layer)].sinks;
  const float scale =
      static_cast<float>(faults_.attention_scale ? 1.0 / double(hd) : c_.attn_scale);
  pool_.run(size_t(n_tok_) * size_t(c_.n_head), [&](size_t task, int thread) {
    const size_t i = task / size_t(c_.n_head), h = task % size_t(c_.n_head);
    const float sink = sinks ? sinks[h] : -std::numeric_limits<float>::infinity();
    const Seg& g = segs_[tok_seg_[i]];
    const int32_t p = g.pos + (int32_t(i) - g.first);
    // Faults: kv_off_by_one drops the newest entry; rewind_noop also reads the
    // stale entries up to kv_len_; causal_mask reads up to the chunk's end.
    int32_t n_kv = (faults_.kv_off_by_one && p > 0) ? p : p + 1;
    if (faults_.rewind_noop) n_kv = std::max(n_kv, g.s->kv_len_);
    if (faults_.causal_mask) n_kv = g.pos + g.n;
    if (g.bidirectional) n_kv = std::max(n_kv, g.pos + g.n);  // the whole image block
    // Positions attended: [t0, n_kv) (a sliding window W keeps the last W: HF's
    // mask, i - W < j <= i).
    const int32_t t0 = window > 0 ? std::max(0, p - window + 1) : 0;
    const float* qh = q_.data() + i * qd + h * hd;
    float* out = att_.data() + i * qd + h * hd;
    if (n_kv <= t0) {  // nothing to attend (only with the kv fault and W = 1): 0/0 as the reference
      std::fill(out, out + hd, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    const int32_t kv_head = faults_.gqa_mapping ? int32_t(h) % c_.n_head_kv : int32_t(h) / group;
    const size_t off = size_t(t0) * kvd + size_t(kv_head) * hd;
    const float* K = g.s->k_rows(layer) + off;
    const float* V = g.s->v_rows(layer) + off;
    float* s = scores_.data() + size_t(thread) * size_t(scores_ctx_ + 1);
    const size_t m = size_t(n_kv - t0);
    const int32_t page = touchstone::Faults::kFaultPageRows;
    if (g.page_from && p > 0 && p % page == 0 && n_kv == p + 1 && m > 1 &&
        p < g.page_from->max_ctx_) {
      // the batch_page_boundary_leak fault: the page's first row (this token's
      // own, the newest) read from entry i-1's cache
      const size_t at = size_t(p) * kvd + size_t(kv_head) * hd;
      const float* xk = g.page_from->k_rows(layer) + at;
      const float* xv = g.page_from->v_rows(layer) + at;
      attend_rows(qh, K, V, kvd, hd, m - 1, &xk, &xv, 1, scale, faults_.softmax_no_max, sink, s,
                  out);
    } else if (g.leak) {  // the fault: entry i-1's newest KV entry joins this query's rows
      const size_t at = size_t(g.leak_pos) * kvd + size_t(kv_head) * hd;
      const float* xk = g.leak->k_rows(layer) + at;
      const float* xv = g.leak->v_rows(layer) + at;
      attend_rows(qh, K, V, kvd, hd, m, &xk, &xv, 1, scale, faults_.softmax_no_max, sink, s, out);
    } else if (faults_.softmax_no_max) {  // the fault: fp32 exp(s) without the max subtraction
      attend_rows(qh, K, V, kvd, hd, m, nullptr, nullptr, 0, scale, true, sink, s, out);
    } else {
      attend_f32(qh, K, V, kvd, hd, m, scale, s, out, sink);
    }
  });
}

}  // namespace touchstone::cpu_simd
