// touchstone/reference_forward.h - the scalar reference transformer, every family.
//
// One token at a time, plain loops, fp64 accumulators, the model described as data
// (ModelConfig); see reference_forward.cpp for the formulas and touchstone/scalar_ops.h
// for the exact accumulation order. This is the definition of "right" that every
// backend is compared with.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "touchstone/model_weights.h"
#include "touchstone/row_pool.h"

namespace touchstone {

// Deliberate faults, used only by the tests that prove the parity harness can
// fail. A default-constructed Faults is the correct model.
struct Faults {
  double rope_base_scale = 1.0;  // "rope_base_off_1pct": freq_base * 1.01
  double logit_noise = 0.0;      // "logits_perturb_1e-3": logit *= 1 +/- 1e-3 (deterministic signs)
  bool kv_off_by_one = false;    // "kv_position_off_by_one": attention skips the newest KV entry
};

// Parses a fault name ("" = none). Throws touchstone::Error listing the known names.
Faults parse_fault(const std::string& name);

class ReferenceTransformer {
 public:
  // max_context: KV cache capacity in tokens (<= 0: the model's context_length).
  // n_threads: rows of each matrix-vector product are split across threads;
  // the result is bitwise identical for any thread count.
  ReferenceTransformer(const ModelWeights& weights, int32_t max_context, int n_threads,
                       Faults faults = {});

  // Runs `token` at position position(), appends its K/V to the cache and writes
  // n_vocab logits (float32, natural-log units before softmax). Throws
  // touchstone::Error when the id is out of range, the cache is full or the buffer
  // does not hold n_vocab floats.
  void forward(int32_t token, std::span<float> logits);

  int32_t position() const { return pos_; }
  int32_t max_context() const { return max_ctx_; }
  int32_t n_vocab() const { return w_.config.n_vocab; }
  // Drops KV entries at positions >= p. Throws if p > position() or p < 0.
  void rewind(int32_t p);

 private:
  void attention(int32_t l, int32_t pos);
  void feed_forward(int32_t l);

  const ModelWeights& w_;
  Faults faults_;
  int32_t max_ctx_ = 0;
  int32_t pos_ = 0;
  RowPool pool_;
  std::vector<float> k_cache_;  // [n_layer][max_ctx][n_head_kv*head_dim], RoPE already applied
  std::vector<float> v_cache_;  // [n_layer][max_ctx][n_head_kv*head_dim]
  // Scratch activations, allocated once: x (residual), xn (normed), q, k, v, att_out, gate, up.
  std::vector<float> x_, xn_, q_, k_, v_, att_out_, gate_, up_;
  std::vector<double> scores_;  // [max_ctx] attention scores of one head
};

}  // namespace touchstone
