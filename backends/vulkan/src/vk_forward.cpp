// vk_forward.cpp - one sequence: buffers, RoPE tables, chunking of prefill() and
// prefill_greedy(), logits and layer taps back to the host. The graph itself is
// recorded in vk_graph.cpp.
#include "vk_forward.h"

#include "touchstone/model/rope_yarn.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "touchstone/model/scalar_ops.h"

namespace touchstone::vk {
namespace {

using abi::StatusError;

size_t f32(size_t n) { return n * sizeof(float); }

// The faults that live in the shaders (shaders/faults.glsl). The GPU form of
// thread_order_reduction: a split-K over the session's n_threads slices with
// fp16 partials (docs/backends/vulkan.md#fault-catalog).
ShaderFaults shader_faults(const Faults& f, int32_t n_threads) {
  ShaderFaults s;
  s.rope_layout = f.rope_layout;
  s.kv_write_next = f.kv_write_next;
  s.gqa_mapping = f.gqa_mapping;
  s.softmax_no_max = f.softmax_no_max;
  s.causal_mask = f.causal_mask;
  s.fp16_out = f.fp16_accumulation;
  s.split_k = f.thread_order_reduction ? uint32_t(std::max(1, n_threads)) : 1u;
  if (f.session_order_reduction) {
    // The split count changes with every session this process opens (a
    // stand-in for a scheduling-dependent reduction order).
    static std::atomic<uint32_t> sessions{0};
    s.split_k = 2u + sessions.fetch_add(1) % 16u;
  }
  s.nibble_order = f.nibble_order;
  s.scale_min_swap = f.quant_scale_min_swap;
  return s;
}

std::unique_ptr<Kernels> fault_kernels(Context& ctx, const Faults& f, int32_t n_threads) {
  const ShaderFaults s = shader_faults(f, n_threads);
  return s.any() ? std::make_unique<Kernels>(ctx, s) : nullptr;
}

}  // namespace

Activations::Activations(Context& ctx, const ModelConfig& c, uint32_t n_rows,
                         uint32_t score_stride_)
    : rows(n_rows), score_stride(score_stride_) {
  const size_t T = n_rows, d = size_t(c.n_embd), hd = size_t(c.head_dim);
  const size_t q_dim = size_t(c.n_head) * hd, kv_dim = size_t(c.n_head_kv) * hd;
  using K = Buffer::Kind;
  x = Buffer(ctx, f32(T * d), K::Device);
  xn = Buffer(ctx, f32(T * d), K::Device);
  q = Buffer(ctx, f32(T * q_dim), K::Device);
  k = Buffer(ctx, f32(T * kv_dim), K::Device);
  v = Buffer(ctx, f32(T * kv_dim), K::Device);
  att = Buffer(ctx, f32(T * q_dim), K::Device);
  const size_t k_used = c.is_moe() ? size_t(c.moe.n_expert_used) : 0, S = T * k_used;  // slots
  const size_t n_ff = std::max(
      {size_t(c.n_ff), k_used * size_t(c.moe.n_ff_exp), size_t(c.moe.n_ff_shexp)});  // per row
  gate = Buffer(ctx, f32(T * n_ff), K::Device);
  up = Buffer(ctx, f32(T * n_ff), K::Device);
  if (S > 0) {
    moe_x = Buffer(ctx, f32(S * d), K::Device);
    moe_out = Buffer(ctx, f32(S * d), K::Device);
    router = Buffer(ctx, f32(T * size_t(c.moe.n_expert)), K::Host);
    route = Buffer(ctx, (3 * S + T) * sizeof(uint32_t), K::Host);
    if (c.moe.n_ff_shexp > 0) {
      moe_shared = Buffer(ctx, f32(T * d), K::Device);
      shexp_logit = Buffer(ctx, f32(T), K::Host);
    }
  }
  blk = Buffer(ctx, f32(T * d), K::Device);
  scores = Buffer(ctx, f32(T * size_t(c.n_head) * score_stride), K::Device);
  tokens = Buffer(ctx, T * sizeof(int32_t), K::Host);
  embd = Buffer(ctx, f32(T * d), K::Host);
  logits = Buffer(ctx, f32(T * size_t(c.n_vocab)), K::Host);
}

void Activations::reserve_scores(Context& ctx, const ModelConfig& c, uint32_t stride) {
  if (stride <= score_stride) return;
  scores = Buffer(ctx, f32(size_t(rows) * size_t(c.n_head) * stride), Buffer::Kind::Device);
  score_stride = stride;
}

BatchWorkspace::BatchWorkspace(Context& ctx, const ModelConfig& c)
    : act(ctx, c, uint32_t(Forward::kChunk), 1), sets(ctx) {}

Forward::Forward(Context& ctx, const Kernels& kernels, const DeviceWeights& weights,
                 int32_t max_context, Faults faults, int32_t n_threads)
    : ctx_(ctx),
      base_kernels_(kernels),
      fault_kernels_(fault_kernels(ctx, faults, n_threads)),
      k_(fault_kernels_ ? *fault_kernels_ : kernels),
      w_(weights),
      faults_(faults),
      n_threads_(n_threads),
      max_ctx_(max_context > 0 ? max_context : weights.config.n_ctx_train),
      sets_(ctx),
      act_(ctx, weights.config, uint32_t(kChunk), uint32_t(max_ctx_)) {
  const ModelConfig& c = w_.config;
  const size_t d = size_t(c.n_embd);
  const size_t kv_dim = size_t(c.n_head_kv) * size_t(c.head_dim);
  // kv_write_next stores position p in row p + 1: one spare row, and zeroed
  // caches (row 0 is read but never written).
  const size_t kv_rows = size_t(max_ctx_) + (faults_.kv_write_next ? 1 : 0);
  using K = Buffer::Kind;
  argmax_ = Buffer(ctx, sizeof(int32_t), K::Host);
  kv_ = std::make_shared<KvCache>();
  for (int32_t l = 0; l < c.n_layer; ++l) {
    kv_->k.emplace_back(ctx, f32(kv_rows * kv_dim), K::Device);
    kv_->v.emplace_back(ctx, f32(kv_rows * kv_dim), K::Device);
    if (faults_.kv_write_next) {
      kv_->k.back().zero();
      kv_->v.back().zero();
    }
  }
  if (faults_.batch_page_boundary_leak) page_save_ = Buffer(ctx, f32(2 * kv_dim), K::Device);
  taps_buf_ = Buffer(ctx, f32(size_t(c.n_layer) * TS_TAP_POINTS * d), K::Host);
  build_rope_tables();
  if (const char* p = std::getenv("TOUCHSTONE_VULKAN_PROFILE"); p && *p && *p != '0')
    prof_ = std::make_unique<Profiler>(ctx);
  ctx_.check_validation();
}

// One (cos, sin) table per distinct (RoPE base, linear scale) of the layers:
// angles in fp64 as ops::rope_theta (base^(-2i / n_rot) * pos / scale /
// freq_factor), rounded once to fp32. The rope_base_off_1pct fault scales every base.
void Forward::build_rope_tables() {
  const ModelConfig& c = w_.config;
  const size_t half = size_t(c.n_rot) / 2, ctx_n = size_t(max_ctx_);
  std::vector<std::pair<double, double>> keys;
  for (const LayerConfig& lc : c.layers) {
    const std::pair<double, double> key{lc.rope_base * faults_.rope_base_scale, lc.rope_scale};
    auto it = std::find(keys.begin(), keys.end(), key);
    rope_of_layer_.push_back(size_t(it - keys.begin()));
    if (it != keys.end()) continue;
    keys.push_back(key);
    std::vector<float> table(ctx_n * half * 2);
    // gpt-oss: YaRN frequencies, cos and sin times mscale (ops::yarn_frequencies).
    const bool yarn = c.rope_yarn.factor != 0.0;
    const ops::YarnFrequencies fr =
        yarn ? ops::yarn_frequencies(c.rope_yarn, c.n_rot, key.first) : ops::YarnFrequencies{};
    for (size_t p = 0; p < ctx_n; ++p) {
      for (size_t i = 0; i < half; ++i) {
        const double ff = w_.rope_freqs.empty() ? 1.0 : double{w_.rope_freqs[i]};
        const double theta =
            yarn ? double(p) * fr.inv_freq[i]
                 : ops::rope_theta(int32_t(p), int64_t(i), c.n_rot, key.first, key.second, ff);
        table[(p * half + i) * 2] = static_cast<float>(std::cos(theta) * fr.mscale);
        table[(p * half + i) * 2 + 1] = static_cast<float>(std::sin(theta) * fr.mscale);
      }
    }
    rope_tables_.emplace_back(ctx_, f32(table.size()), Buffer::Kind::Device);
    rope_tables_.back().upload(table.data(), f32(table.size()));
  }
}

Forward::~Forward() {
  if (prof_) prof_->print(w_.quantized ? "quantized" : "full_precision");
}

void Forward::check_room(int32_t n) const {
  if (pos_ + int64_t{n} > max_ctx_) {
    throw StatusError(TS_ERR_CONTEXT_FULL, "position " + std::to_string(pos_) + " + " +
                                               std::to_string(n) + " tokens exceeds max context " +
                                               std::to_string(max_ctx_));
  }
}

int32_t Forward::prefill_greedy(const int32_t* tokens, int32_t n) {
  if (!tokens || n <= 0)
    throw StatusError(TS_ERR_INVALID_ARGUMENT, "greedy: null tokens or n <= 0");
  abi::check_tokens(tokens, n, n_vocab());
  if (faults_.logit_noise != 0.0) {  // the noise is applied on the host
    std::vector<float> l(static_cast<size_t>(n_vocab()));
    prefill(tokens, n, false, l.data());
    return abi::greedy_argmax(l.data(), n_vocab());  // throws when every logit is NaN
  }
  check_room(n);
  rope_origin_ = faults_.prefill_position_reset && n > 1 ? uint32_t(pos_) : 0u;  // as in prefill()
  for (int32_t done = 0; done < n;) {
    const int32_t m = std::min(kChunk, n - done);
    run_chunk(tokens + done, uint32_t(m), false, nullptr, done + m == n, done + m == n);
    done += m;
  }
  rope_origin_ = 0;
  int32_t best = 0;
  std::memcpy(&best, argmax_.mapped(), sizeof(best));
  if (best < 0) throw StatusError(TS_ERR_INTERNAL, "greedy: every logit is NaN");  // argmax.comp
  return best;
}

void Forward::prefill(const int32_t* tokens, int32_t n, bool all_positions, float* logits) {
  check_room(n);
  const size_t v = size_t(w_.config.n_vocab);
  const int32_t start = pos_;
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (K/V still stored at the right rows).
  rope_origin_ = faults_.prefill_position_reset && n > 1 ? uint32_t(pos_) : 0u;
  for (int32_t done = 0; done < n;) {
    const int32_t m = std::min(kChunk, n - done);
    const bool last = done + m == n;
    // Logits are needed for every chunk when all_positions, else only for the last token.
    if (all_positions) {
      run_chunk(tokens + done, uint32_t(m), true, logits + size_t(done) * v, false, last);
    } else {
      run_chunk(tokens + done, uint32_t(m), false, last ? logits : nullptr, false, last);
    }
    done += m;
  }
  rope_origin_ = 0;
  shift_rows(start, n, all_positions, logits);
}

void Forward::prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all_positions,
                                 float* logits) {
  bidirectional = bidirectional && !faults_.image_attended_causally;  // the fault: causal
  check_room(n);
  // A bidirectional block is one pass: every row reads every other row's K/V in every
  // layer (a real Gemma 3 image is 256 rows, a pass holds kChunk).
  const int32_t step = bidirectional ? n : kChunk;
  Activations* act = &act_;
  if (step > kChunk) {
    if (!block_act_ || block_act_->rows < uint32_t(step))
      block_act_ =
          std::make_unique<Activations>(ctx_, w_.config, uint32_t(step), uint32_t(max_ctx_));
    act = block_act_.get();
  }
  const size_t v = size_t(w_.config.n_vocab), d = size_t(w_.config.n_embd);
  for (int32_t done = 0; done < n;) {
    const uint32_t m = uint32_t(std::min(step, n - done));
    const bool last = done + int32_t(m) == n;
    const uint32_t out_rows = all_positions ? m : (last ? 1u : 0u);
    Segment seg = segment(0, m, out_rows, 0, taps_on_ && last);
    seg.bidirectional = bidirectional;
    const Pass p{*act, sets_, std::span<const Segment>(&seg, 1), m, out_rows, false, seg.tap, true};
    std::memcpy(act->embd.mapped(), e + size_t(done) * d, f32(size_t(m) * d));
    run_pass(nullptr, p);
    if (out_rows > 0) copy_logits(p, seg, all_positions ? logits + size_t(done) * v : logits);
    done += int32_t(m);
  }
}

// The faults logits_row_shift (any all-position call), verify_row_shift (one
// that continues a sequence) and batch_all_positions_shift (an entry of a
// step_batch of several): row i holds row i-1.
void Forward::shift_rows(int32_t start, int32_t n, bool all_positions, float* logits,
                         bool in_batch) const {
  const bool shift = faults_.logits_row_shift || (faults_.verify_row_shift && start > 0) ||
                     (faults_.batch_all_positions_shift && in_batch);
  if (!shift || !all_positions || n <= 1) return;
  const size_t v = size_t(w_.config.n_vocab);
  std::memmove(logits + v, logits, f32(size_t(n - 1) * v));
}

Segment Forward::segment(uint32_t row0, uint32_t n, uint32_t out_rows, uint32_t out_row0,
                         bool tap) {
  Segment s;
  s.f = this;
  s.row0 = row0;
  s.n = n;
  s.pos0 = uint32_t(pos_);
  s.rope_origin = rope_origin_;
  s.kv_len = uint32_t(std::max(kv_len_, pos_ + int32_t(n)));
  s.out_rows = out_rows;
  s.out_row0 = out_row0;
  s.tap = tap;
  return s;
}

void Forward::run_chunk(const int32_t* tokens, uint32_t n, bool all_positions, float* logits,
                        bool argmax, bool last) {
  const bool tap = taps_on_ && last;
  const uint32_t out_rows = logits || argmax ? (all_positions ? n : 1u) : 0u;
  const Segment seg = segment(0, n, out_rows, 0, tap);
  const Pass p{act_, sets_, std::span<const Segment>(&seg, 1), n, out_rows, argmax, tap};
  run_pass(tokens, p);
  if (logits) copy_logits(p, seg, logits);
}

void Forward::run_pass(const int32_t* tokens, const Pass& p) {
  if (tokens) std::memcpy(p.act.tokens.mapped(), tokens, p.n * sizeof(int32_t));
  // Block outputs of a skipped layer (last_layer_skipped fault) stay zero.
  for (const Segment& s : p.segs)
    if (s.tap) std::memset(s.f->taps_buf_.mapped(), 0, s.f->taps_buf_.size());
  // Not ctx_.run: a mixture-of-experts layer submits mid-pass (flush) and the
  // recorder continues in a new command buffer.
  const VkCommandBuffer cb = ctx_.begin();
  if (prof_) prof_->begin(cb);
  Recorder r(cb, p.sets, prof_.get());
  record(r, p);
  ctx_.submit_and_wait(r.handle());
  if (prof_) prof_->collect();
  for (const Segment& s : p.segs) {
    Forward& f = *s.f;
    if (s.tap) {
      const float* t = static_cast<const float*>(f.taps_buf_.mapped());
      f.taps_.assign(t, t + f.taps_buf_.size() / sizeof(float));
    }
    f.pos_ += int32_t(s.n);
    f.kv_len_ = std::max(f.kv_len_, f.pos_);
  }
}

void Forward::copy_logits(const Pass& p, const Segment& s, float* out) const {
  const size_t v = size_t(w_.config.n_vocab), rows = s.out_rows;
  const float* src = static_cast<const float*>(p.act.logits.mapped()) + size_t(s.out_row0) * v;
  std::memcpy(out, src, f32(rows * v));
  if (faults_.logit_noise == 0.0) return;
  // The position of each row: the segment's last rows (its sequence has advanced).
  const int32_t pos0 = int32_t(s.pos0 + s.n - s.out_rows);
  for (size_t r = 0; r < rows; ++r) {
    const uint64_t base = uint64_t(pos0 + int32_t(r)) * uint64_t(v);
    for (size_t i = 0; i < v; ++i) {
      float& l = out[r * v + i];
      l = static_cast<float>(double{l} *
                             (1.0 + faults_.logit_noise * touchstone::fault_noise_sign(base + i)));
    }
  }
}

}  // namespace touchstone::vk
