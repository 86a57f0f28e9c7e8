// vk_forward.cpp - the forward graph: per layer RMSNorm -> Q/K/V matmuls ->
// RoPE + KV store -> attention -> Wo (+residual) -> RMSNorm -> gate/up ->
// SwiGLU -> down (+residual); then the final norm and the LM head.
#include "vk_forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

Forward::Forward(Context& ctx, const Kernels& kernels, const DeviceWeights& weights,
                 int32_t max_context, Faults faults, int32_t n_threads)
    : ctx_(ctx),
      fault_kernels_(fault_kernels(ctx, faults, n_threads)),
      k_(fault_kernels_ ? *fault_kernels_ : kernels),
      w_(weights),
      faults_(faults),
      sets_(ctx) {
  const ModelConfig& c = w_.config;
  max_ctx_ = max_context > 0 ? max_context : c.n_ctx_train;
  const size_t T = kChunk, d = size_t(c.n_embd), hd = size_t(c.head_dim);
  const size_t q_dim = size_t(c.n_head) * hd, kv_dim = size_t(c.n_head_kv) * hd,
               ctx_n = size_t(max_ctx_);
  // kv_write_next stores position p in row p + 1: one spare row, and zeroed
  // caches (row 0 is read but never written).
  const size_t kv_rows = ctx_n + (faults_.kv_write_next ? 1 : 0);
  using K = Buffer::Kind;
  x_ = Buffer(ctx, f32(T * d), K::Device);
  xn_ = Buffer(ctx, f32(T * d), K::Device);
  q_ = Buffer(ctx, f32(T * q_dim), K::Device);
  k_buf_ = Buffer(ctx, f32(T * kv_dim), K::Device);
  v_ = Buffer(ctx, f32(T * kv_dim), K::Device);
  att_ = Buffer(ctx, f32(T * q_dim), K::Device);
  gate_ = Buffer(ctx, f32(T * size_t(c.n_ff)), K::Device);
  up_ = Buffer(ctx, f32(T * size_t(c.n_ff)), K::Device);
  scores_ = Buffer(ctx, f32(T * size_t(c.n_head) * ctx_n), K::Device);
  tokens_ = Buffer(ctx, T * sizeof(int32_t), K::Host);
  logits_ = Buffer(ctx, f32(T * size_t(c.n_vocab)), K::Host);
  argmax_ = Buffer(ctx, sizeof(int32_t), K::Host);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    kc_.emplace_back(ctx, f32(kv_rows * kv_dim), K::Device);
    vc_.emplace_back(ctx, f32(kv_rows * kv_dim), K::Device);
    if (faults_.kv_write_next) {
      kc_.back().zero();
      vc_.back().zero();
    }
  }
  // RoPE table in fp64, rounded once: (cos, sin) of pos * base^(-2i/hd).
  const double base = double{c.rope_freq_base} * faults_.rope_base_scale;
  std::vector<float> rope(ctx_n * hd);
  for (size_t p = 0; p < ctx_n; ++p) {
    for (size_t i = 0; i < hd / 2; ++i) {
      const double theta = double(p) * std::pow(base, -2.0 * double(i) / double(hd));
      rope[(p * hd / 2 + i) * 2] = static_cast<float>(std::cos(theta));
      rope[(p * hd / 2 + i) * 2 + 1] = static_cast<float>(std::sin(theta));
    }
  }
  rope_ = Buffer(ctx, f32(rope.size()), K::Device);
  rope_.upload(rope.data(), f32(rope.size()));
  if (const char* p = std::getenv("TOUCHSTONE_VULKAN_PROFILE"); p && *p && *p != '0')
    prof_ = std::make_unique<Profiler>(ctx);
  ctx_.check_validation();
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

int32_t Forward::greedy(const int32_t* tokens, int32_t n) {
  if (!tokens || n <= 0)
    throw StatusError(TS_ERR_INVALID_ARGUMENT, "greedy: null tokens or n <= 0");
  abi::check_tokens(tokens, n, n_vocab());
  if (faults_.logit_noise != 0.0) {  // the noise is applied on the host
    std::vector<float> l(static_cast<size_t>(n_vocab()));
    run(tokens, n, false, l.data());
    return abi::greedy_argmax(l.data(), n_vocab());  // throws when every logit is NaN
  }
  check_room(n);
  rope_origin_ = faults_.prefill_position_reset && n > 1 ? uint32_t(pos_) : 0u;  // as in run()
  for (int32_t done = 0; done < n;) {
    const int32_t m = std::min(kChunk, n - done);
    run_chunk(tokens + done, uint32_t(m), false, nullptr, done + m == n);
    done += m;
  }
  rope_origin_ = 0;
  int32_t best = 0;
  std::memcpy(&best, argmax_.mapped(), sizeof(best));
  if (best < 0) throw StatusError(TS_ERR_INTERNAL, "greedy: every logit is NaN");  // argmax.comp
  return best;
}

void Forward::run(const int32_t* tokens, int32_t n, bool all_positions, float* logits) {
  check_room(n);
  const size_t v = size_t(w_.config.n_vocab);
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (K/V still stored at the right rows).
  rope_origin_ = faults_.prefill_position_reset && n > 1 ? uint32_t(pos_) : 0u;
  for (int32_t done = 0; done < n;) {
    const int32_t m = std::min(kChunk, n - done);
    const bool last = done + m == n;
    // Logits are needed for every chunk when all_positions, else only for the last token.
    if (all_positions) {
      run_chunk(tokens + done, uint32_t(m), true, logits + size_t(done) * v);
    } else {
      run_chunk(tokens + done, uint32_t(m), false, last ? logits : nullptr);
    }
    done += m;
  }
  rope_origin_ = 0;
  if (faults_.logits_row_shift && all_positions && n > 1)  // the fault: row i holds row i-1
    std::memmove(logits + v, logits, f32(size_t(n - 1) * v));
}

void Forward::run_chunk(const int32_t* tokens, uint32_t n, bool all_positions, float* logits,
                        bool argmax) {
  std::memcpy(tokens_.mapped(), tokens, n * sizeof(int32_t));
  ctx_.run([&](VkCommandBuffer cb) {
    if (prof_) prof_->begin(cb);
    Recorder r(cb, sets_, prof_.get());
    record(r, n, all_positions, logits != nullptr || argmax, argmax);
  });
  if (prof_) prof_->collect();
  const int32_t pos0 = pos_;
  pos_ += int32_t(n);
  kv_len_ = std::max(kv_len_, pos_);
  if (!logits) return;
  const size_t v = size_t(w_.config.n_vocab), rows = all_positions ? n : 1;
  std::memcpy(logits, logits_.mapped(), f32(rows * v));
  if (faults_.logit_noise != 0.0) {
    for (size_t r = 0; r < rows; ++r) {
      const int32_t pos = all_positions ? pos0 + int32_t(r) : pos0 + int32_t(n) - 1;
      const uint64_t base = uint64_t(pos) * uint64_t(v);
      for (size_t i = 0; i < v; ++i) {
        float& l = logits[r * v + i];
        l = static_cast<float>(
            double{l} * (1.0 + faults_.logit_noise * touchstone::fault_noise_sign(base + i)));
      }
    }
  }
}

// One transformer layer over the chunk's n tokens: x_ += attention, x_ += FFN.
void Forward::record_layer(Recorder& r, size_t l, uint32_t n) {
  const ModelConfig& c = w_.config;
  const DeviceLayer& L = w_.layers[l];
  const uint32_t d = uint32_t(c.n_embd), hd = uint32_t(c.head_dim), n_ff = uint32_t(c.n_ff);
  const uint32_t q_dim = uint32_t(c.n_head) * hd, kv_dim = uint32_t(c.n_head_kv) * hd;
  const uint32_t pos0 = uint32_t(pos_);
  const RmsNormPush norm{d, n, 0, d, 0, d, float(c.rms_norm_eps * faults_.rms_eps_scale)};
  r.dispatch(k_.rms_norm(), {&x_, &L.attn_norm, &xn_}, norm, n);
  r.barrier();
  record_matmul(r, k_, L.wq.type, L.wq.buf, xn_, q_, MatmulPush{d, q_dim, n, 0, d, 0, q_dim, 0});
  record_matmul(r, k_, L.wk.type, L.wk.buf, xn_, k_buf_,
                MatmulPush{d, kv_dim, n, 0, d, 0, kv_dim, 0});
  record_matmul(r, k_, L.wv.type, L.wv.buf, xn_, v_, MatmulPush{d, kv_dim, n, 0, d, 0, kv_dim, 0});
  r.barrier();
  r.dispatch(k_.rope_store(), {&q_, &k_buf_, &v_, &kc_[l], &vc_[l], &rope_},
             RopeStorePush{n, pos0, uint32_t(c.n_head), uint32_t(c.n_head_kv), hd, rope_origin_},
             n);
  r.barrier();
  // Faults: attention_scale (1/hd), kv_position_off_by_one (drop_newest),
  // rewind_noop (kv_len_ kept past a rewind: the stale entries are attended).
  const double scale = faults_.attention_scale ? 1.0 / double(hd) : 1.0 / std::sqrt(double(hd));
  const AttentionPush ap{n,
                         pos0,
                         uint32_t(c.n_head),
                         uint32_t(c.n_head_kv),
                         hd,
                         uint32_t(max_ctx_),
                         faults_.kv_off_by_one ? 1u : 0u,
                         static_cast<float>(scale),
                         uint32_t(std::max(kv_len_, pos_ + int32_t(n)))};
  r.dispatch(k_.attention(hd), {&q_, &kc_[l], &vc_[l], &scores_, &att_}, ap, uint32_t(c.n_head), n);
  r.barrier();
  record_matmul(r, k_, L.wo.type, L.wo.buf, att_, x_, MatmulPush{q_dim, d, n, 0, q_dim, 0, d, 1});
  r.barrier();
  r.dispatch(k_.rms_norm(), {&x_, &L.ffn_norm, &xn_}, norm, n);
  r.barrier();
  record_matmul(r, k_, L.gate.type, L.gate.buf, xn_, gate_,
                MatmulPush{d, n_ff, n, 0, d, 0, n_ff, 0});
  record_matmul(r, k_, L.up.type, L.up.buf, xn_, up_, MatmulPush{d, n_ff, n, 0, d, 0, n_ff, 0});
  r.barrier();
  r.dispatch(k_.swiglu(), {&gate_, &up_}, SwigluPush{n * n_ff},
             (n * n_ff + kWorkgroup - 1) / kWorkgroup);
  r.barrier();
  record_matmul(r, k_, L.down.type, L.down.buf, gate_, x_,
                MatmulPush{n_ff, d, n, 0, n_ff, 0, d, 1});
  r.barrier();
}

void Forward::record(Recorder& r, uint32_t n, bool all_positions, bool want_logits, bool argmax) {
  const ModelConfig& c = w_.config;
  const uint32_t d = uint32_t(c.n_embd), vocab = uint32_t(c.n_vocab);
  const float eps = float(c.rms_norm_eps * faults_.rms_eps_scale);  // rms_eps_10x fault

  r.dispatch(k_.get_rows(w_.token_embd.type), {&w_.token_embd.buf, &tokens_, &x_},
             GetRowsPush{d, n, 0, w_.token_embd.n_out}, n);
  r.barrier();
  // The last_layer_skipped fault: the loop stops one layer early.
  const size_t n_layer = w_.layers.size() - (faults_.last_layer_skipped ? 1 : 0);
  for (size_t l = 0; l < n_layer; ++l) record_layer(r, l, n);
  if (!want_logits) return;  // an inner prefill chunk: only the KV cache matters
  // Final norm and LM head: every position, or only the last one.
  const uint32_t rows = all_positions ? n : 1, first = all_positions ? 0 : n - 1;
  r.dispatch(k_.rms_norm(), {&x_, &w_.output_norm, &xn_},
             RmsNormPush{d, rows, first * d, d, 0, d, eps}, rows);
  r.barrier();
  const DeviceMatrix& head = w_.lm_head();
  record_matmul(r, k_, head.type, head.buf, xn_, logits_,
                MatmulPush{d, vocab, rows, 0, d, 0, vocab, 0});
  if (argmax) {  // of the last row written
    r.barrier();
    r.dispatch(k_.argmax(), {&logits_, &argmax_}, ArgmaxPush{vocab, (rows - 1) * vocab}, 1);
  }
  r.host_barrier();
}

}  // namespace touchstone::vk
