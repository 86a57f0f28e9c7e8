// llama_forward.cpp - the scalar reference forward pass, in one readable file.
//
// Formulas follow Hugging Face transformers' LlamaForCausalLM (modeling_llama.py):
//   x   = token_embd[token]
//   for each layer:
//     h   = RMSNorm(x) * attn_norm
//     q,k,v = Wq h, Wk h, Wv h;  RoPE(q), RoPE(k) at this position;  append k, v to the KV cache
//     per query head h (GQA: it reads KV head h / (n_head / n_head_kv)):
//        s_t = q_h . k_t / sqrt(head_dim)  for t = 0..pos;  p = softmax(s);  o_h = sum_t p_t v_t
//     x  += Wo o
//     h   = RMSNorm(x) * ffn_norm
//     x  += Wdown (SiLU(Wgate h) * (Wup h))                    (SwiGLU)
//   logits = W_lm_head (RMSNorm(x) * output_norm)
//
// Numerics (the "documented accumulation order"):
//   - Weights and stored activations are fp32 (weights dequantized once at load).
//   - Every reduction (dot products, RMSNorm mean square, attention scores,
//     softmax sums, attention weighted sums) accumulates in fp64. Dot products
//     of length n use four fp64 partial sums s_j over i = j (mod 4), taken in
//     increasing i, combined as (s0 + s1) + (s2 + s3); a tail (n % 4) is added
//     to s0 in order before combining. Other sums run in increasing index.
//   - Elementwise maths (rsqrt, exp, sin/cos, SiLU) are done in fp64 and the
//     result is rounded once to fp32 when stored.
//   - Matrix rows are split across the threads of a RowPool but a row is never split, so
//     results are bitwise identical for any thread count and across runs.
#include "touchstone/llama_forward.h"

#include <cmath>
#include <cstring>

#include "touchstone/error.h"

namespace touchstone {
namespace {

// Dot product of length n, four fp64 partial sums (see the header comment).
// target_clones only lets the compiler keep the four partial sums in one
// vector register; the operations and their order are the same on every
// target (no reassociation, -ffp-contract=off), so results are bitwise equal.
__attribute__((target_clones("avx2", "default"))) double dot(const float* a, const float* b,
                                                             int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double{a[i + 0]} * double{b[i + 0]};
    s1 += double{a[i + 1]} * double{b[i + 1]};
    s2 += double{a[i + 2]} * double{b[i + 2]};
    s3 += double{a[i + 3]} * double{b[i + 3]};
  }
  for (; i < n; ++i) s0 += double{a[i]} * double{b[i]};
  return (s0 + s1) + (s2 + s3);
}

// y[o] = W[o, :] . x for a row-major W of shape [n_out][n_in]; rows split across the pool.
void matvec(RowPool& pool, const float* W, const float* x, float* y, int64_t n_out, int64_t n_in) {
  pool.run(n_out, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) y[o] = static_cast<float>(dot(W + o * n_in, x, n_in));
  });
}

// out = x / sqrt(mean(x^2) + eps) * weight   (HF LlamaRMSNorm)
void rms_norm(const float* x, const float* weight, float* out, int64_t n, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double{x[i]} * double{x[i]};
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(double{x[i]} * inv * double{weight[i]});
}

// Interleaved RoPE over one head of size hd: pairs (2i, 2i+1) rotate by
// pos * base^(-2i/hd). On GGUF weights (Q/K rows permuted by the converter, see
// llama_weights.h) this equals HF's rotate_half RoPE on the original weights.
void rope(float* v, int64_t hd, int32_t pos, double base) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double theta = static_cast<double>(pos) *
                         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    const double c = std::cos(theta), s = std::sin(theta);
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = static_cast<float>(x0 * c - x1 * s);
    v[2 * i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

// Deterministic +-1 for the logit-noise fault (splitmix64 of the index).
double noise_sign(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return ((z ^ (z >> 31)) & 1u) ? 1.0 : -1.0;
}

}  // namespace

Faults parse_fault(const std::string& name) {
  Faults f;
  if (name.empty()) return f;
  if (name == "rope_base_off_1pct") {
    f.rope_base_scale = 1.01;
  } else if (name == "logits_perturb_1e-3") {
    f.logit_noise = 1e-3;
  } else if (name == "kv_position_off_by_one") {
    f.kv_off_by_one = true;
  } else {
    throw Error(
        "unknown fault '{}' (known: rope_base_off_1pct, logits_perturb_1e-3, "
        "kv_position_off_by_one)",
        name);
  }
  return f;
}

LlamaReference::LlamaReference(const LlamaWeights& weights, int32_t max_context, int n_threads,
                               Faults faults)
    : w_(weights), faults_(faults), pool_(n_threads) {
  const LlamaConfig& c = w_.config;
  max_ctx_ = max_context > 0 ? max_context : c.n_ctx_train;
  const size_t kv_dim = size_t(c.n_head_kv) * size_t(c.head_dim);
  k_cache_.assign(size_t(c.n_layer) * size_t(max_ctx_) * kv_dim, 0.0f);
  v_cache_.assign(k_cache_.size(), 0.0f);
  x_.resize(size_t(c.n_embd));
  xn_.resize(size_t(c.n_embd));
  q_.resize(size_t(c.n_head) * size_t(c.head_dim));
  k_.resize(kv_dim);
  v_.resize(kv_dim);
  att_out_.resize(q_.size());
  gate_.resize(size_t(c.n_ff));
  up_.resize(size_t(c.n_ff));
  scores_.resize(size_t(max_ctx_));
}

void LlamaReference::rewind(int32_t p) {
  if (p < 0 || p > pos_) throw Error("rewind to position {} outside [0, {}]", p, pos_);
  pos_ = p;  // entries >= p are overwritten by later tokens and never read before then
}

void LlamaReference::forward(int32_t token, std::span<float> logits) {
  const LlamaConfig& c = w_.config;
  if (token < 0 || token >= c.n_vocab) {
    throw Error("token id {} at position {} outside [0, {})", token, pos_, c.n_vocab);
  }
  if (pos_ >= max_ctx_) throw Error("KV cache full: position {} >= max context {}", pos_, max_ctx_);
  if (logits.size() != size_t(c.n_vocab)) {
    throw Error("logits buffer holds {} floats, n_vocab is {}", logits.size(), c.n_vocab);
  }
  const int64_t d = c.n_embd, hd = c.head_dim, n_ff = c.n_ff;
  const int64_t q_dim = int64_t{c.n_head} * hd, kv_dim = int64_t{c.n_head_kv} * hd;
  const int32_t group = c.n_head / c.n_head_kv;  // query heads per KV head (GQA)
  const double eps = c.rms_norm_eps;
  const double rope_base = double{c.rope_freq_base} * faults_.rope_base_scale;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const int32_t pos = pos_;

  std::memcpy(x_.data(), w_.token_embd.data() + int64_t{token} * d, size_t(d) * sizeof(float));

  for (int32_t l = 0; l < c.n_layer; ++l) {
    const LlamaLayerWeights& L = w_.layers[size_t(l)];
    float* k_layer = k_cache_.data() + size_t(l) * size_t(max_ctx_) * size_t(kv_dim);
    float* v_layer = v_cache_.data() + size_t(l) * size_t(max_ctx_) * size_t(kv_dim);

    // ---- attention ----
    rms_norm(x_.data(), L.attn_norm.data(), xn_.data(), d, eps);
    matvec(pool_, L.wq.data(), xn_.data(), q_.data(), q_dim, d);
    matvec(pool_, L.wk.data(), xn_.data(), k_.data(), kv_dim, d);
    matvec(pool_, L.wv.data(), xn_.data(), v_.data(), kv_dim, d);
    for (int32_t h = 0; h < c.n_head; ++h) rope(q_.data() + h * hd, hd, pos, rope_base);
    for (int32_t h = 0; h < c.n_head_kv; ++h) rope(k_.data() + h * hd, hd, pos, rope_base);
    std::memcpy(k_layer + size_t(pos) * size_t(kv_dim), k_.data(), size_t(kv_dim) * sizeof(float));
    std::memcpy(v_layer + size_t(pos) * size_t(kv_dim), v_.data(), size_t(kv_dim) * sizeof(float));

    // Positions attended: 0..pos (causal). The kv_off_by_one fault drops the newest entry.
    const int32_t n_kv = (faults_.kv_off_by_one && pos > 0) ? pos : pos + 1;
    for (int32_t h = 0; h < c.n_head; ++h) {
      const float* qh = q_.data() + h * hd;
      const int64_t kv_off = int64_t{h / group} * hd;
      double max_s = -INFINITY;
      for (int32_t t = 0; t < n_kv; ++t) {
        scores_[size_t(t)] = dot(qh, k_layer + int64_t{t} * kv_dim + kv_off, hd) * scale;
        max_s = std::max(max_s, scores_[size_t(t)]);
      }
      double sum = 0.0;
      for (int32_t t = 0; t < n_kv; ++t) {
        scores_[size_t(t)] = std::exp(scores_[size_t(t)] - max_s);
        sum += scores_[size_t(t)];
      }
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int32_t t = 0; t < n_kv; ++t) {
          acc += scores_[size_t(t)] * double{v_layer[int64_t{t} * kv_dim + kv_off + i]};
        }
        att_out_[size_t(h * hd + i)] = static_cast<float>(acc / sum);
      }
    }
    matvec(pool_, L.wo.data(), att_out_.data(), xn_.data(), d, q_dim);
    for (int64_t i = 0; i < d; ++i)
      x_[size_t(i)] = static_cast<float>(double{x_[size_t(i)]} + double{xn_[size_t(i)]});

    // ---- SwiGLU MLP ----
    rms_norm(x_.data(), L.ffn_norm.data(), xn_.data(), d, eps);
    matvec(pool_, L.w_gate.data(), xn_.data(), gate_.data(), n_ff, d);
    matvec(pool_, L.w_up.data(), xn_.data(), up_.data(), n_ff, d);
    for (int64_t i = 0; i < n_ff; ++i) {
      const double g = gate_[size_t(i)];
      gate_[size_t(i)] = static_cast<float>(g / (1.0 + std::exp(-g)) * double{up_[size_t(i)]});
    }
    matvec(pool_, L.w_down.data(), gate_.data(), xn_.data(), d, n_ff);
    for (int64_t i = 0; i < d; ++i)
      x_[size_t(i)] = static_cast<float>(double{x_[size_t(i)]} + double{xn_[size_t(i)]});
  }

  // ---- final norm + LM head ----
  rms_norm(x_.data(), w_.output_norm.data(), xn_.data(), d, eps);
  matvec(pool_, w_.lm_head().data(), xn_.data(), logits.data(), c.n_vocab, d);
  if (faults_.logit_noise != 0.0) {
    const uint64_t base = uint64_t(pos) * uint64_t(c.n_vocab);
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = static_cast<float>(double{logits[i]} *
                                     (1.0 + faults_.logit_noise * noise_sign(base + i)));
    }
  }
  ++pos_;
}

}  // namespace touchstone
