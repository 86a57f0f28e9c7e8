// touchstone/reference_forward.h - the scalar reference transformer, every family.
//
// One token at a time, plain loops, fp64 accumulators, the model described as data
// (ModelConfig); see reference_forward.cpp for the formulas and touchstone/scalar_ops.h
// for the exact accumulation order. This is the definition of "right" that every
// backend is compared with.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/model_weights.h"
#include "touchstone/row_pool.h"

namespace touchstone {

// Deliberate faults, used only by the tests that prove the parity harness can
// fail (the catalog: docs/metrics.md#fault-catalog-and-margins). A
// default-constructed Faults is the correct model. Each names one realistic
// implementation bug; backends implement the ones they can and refuse the rest.
struct Faults {
  std::string name;              // as given to parse_fault ("" = none)
  double rope_base_scale = 1.0;  // "rope_base_off_1pct": freq_base * 1.01
  double logit_noise = 0.0;      // "logits_perturb_1e-3": logit *= 1 +/- 1e-3 (deterministic signs)
  bool kv_off_by_one = false;    // "kv_position_off_by_one": attention skips the newest KV entry
  bool rope_layout = false;      // "rope_layout": NeoX pairs for an interleaved model and back
  bool kv_write_next = false;    // "kv_write_next": K/V of position p written at p + 1
  bool gqa_mapping = false;      // "gqa_mapping": query head h reads KV head h % n_head_kv
  bool attention_scale = false;  // "attention_scale": scores * 1/head_dim (not 1/sqrt)
  bool softmax_no_max = false;   // "softmax_no_max": fp32 exp(s) without max subtraction
  double rms_eps_scale = 1.0;    // "rms_eps_10x": every RMSNorm epsilon * 10
  bool quant_scale_min_swap = false;  // "quant_scale_min_swap": Q4_1/Q5_1/Q4_K/Q5_K d <-> m
  bool nibble_order = false;          // "nibble_order": low/high nibbles swapped (4/5-bit blocks)
  bool fp16_accumulation = false;     // "fp16_accumulation": matmul outputs rounded to fp16
  bool rewind_noop = false;           // "rewind_noop": rewind keeps the stale KV entries attended
  bool causal_mask = false;           // "causal_mask": prefill attends to the chunk's future tokens
  bool thread_order_reduction = false;  // "thread_order_reduction": dot products split per thread
  bool last_layer_skipped = false;      // "last_layer_skipped": the last layer is not run
  // Faults built for one golden-free consistency check each (docs/metrics.md):
  bool logits_row_shift =
      false;  // "logits_row_shift": all-position prefill returns row i-1 as row i
  bool prefill_position_reset = false;   // "prefill_position_reset": a prefill continuing a
                                         // sequence numbers its RoPE positions from 0
  bool session_order_reduction = false;  // "session_order_reduction": dot products split at a
                                         // point that changes with every session opened
  int session_slices = 0;  // session_order_reduction: this session's slice count (set at open)
  int batch_slices = 0;    // batch_token_count_split: the current step_batch call's slice
                           // count (set by step_batch for the call only, else 0)
  // Serving faults (ABI v6; one serving check each, docs/serving-checks.md):
  bool batch_token_count_split = false;  // "batch_token_count_split": in step_batch, dot
                                         // products split at a point set by the batch's
                                         // total token count (batch_invariance)
  bool batch_kv_leak = false;    // "batch_kv_leak": in step_batch, entry i > 0 also attends the
                                 // last KV entry of entry i-1's sequence (content_isolation)
  bool fork_short_copy = false;  // "fork_short_copy": fork_session copies n_prefix - 1 KV
                                 // entries (the last one left zero) (prefix_fork)
  bool batch_position_offset = false;  // "batch_position_offset": in step_batch, entry i > 0
                                       // rotates its tokens as if flattened after the
                                       // previous entries' tokens (batch_invariance)
  bool verify_row_shift = false;  // "verify_row_shift": an all-position prefill that continues a
                                  // sequence (position > 0) returns row i-1 as row i
                                  // (speculative_verify)

  // The faults that corrupt only the quantized weight path (GGUF blocks).
  bool quantized_only() const { return quant_scale_min_swap || nibble_order; }
  // The serving faults (a backend without step_batch / fork_session refuses them).
  bool serving() const {
    return batch_token_count_split || batch_kv_leak || fork_short_copy || batch_position_offset ||
           verify_row_shift;
  }
};

// Every fault name parse_fault knows, in catalog order.
const std::vector<std::string>& fault_names();

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

  // backend_abi.h prefill: appends `tokens` at position(), one forward() per
  // token, and writes the logits of the last token (n_vocab floats) or, when
  // all_positions, of every token (tokens.size() * n_vocab, row-major). Throws
  // touchstone::Error when logits has another size (and as forward() does).
  // Faults applied here: causal_mask, prefill_position_reset, logits_row_shift,
  // verify_row_shift.
  void prefill(std::span<const int32_t> tokens, bool all_positions, std::span<float> logits);

  // One sequence's share of step_batch: as the arguments of prefill().
  struct BatchEntry {
    ReferenceTransformer* ref = nullptr;
    std::span<const int32_t> tokens;
    bool all_positions = false;
    std::span<float> logits;
  };
  // backend_abi.h step_batch: runs the entries in order, each exactly as
  // entry.ref->prefill(...) would. The reference computes one token at a time,
  // so an entry's bits do not depend on the batch (batch invariant by
  // construction); it is a loop, not one forward pass. Entries must hold
  // distinct transformers of the same weights, tokens, logits of prefill's
  // size and room in the cache (else throws touchstone::Error before any entry
  // runs; a bad token id still throws midway, as forward() does). Faults
  // applied here only: batch_token_count_split,
  // batch_kv_leak, batch_position_offset (each entry's own faults decide).
  static void step_batch(std::span<const BatchEntry> entries);

  // backend_abi.h fork_session: a new transformer with this one's weights,
  // capacity, thread count and faults whose KV cache holds this one's first
  // n_prefix entries (copy_prefix). Taps start off.
  std::unique_ptr<ReferenceTransformer> fork(int32_t n_prefix) const;
  // Makes this transformer hold src's first n_prefix KV entries of every layer
  // (only those rows are copied) at position() == n_prefix. src must use the
  // same weights; 0 <= n_prefix <= src.position() and n_prefix <= max_context()
  // (throws touchstone::Error otherwise). fork_short_copy fault (this one's
  // faults): row n_prefix - 1 is not copied and is left zero.
  void copy_prefix(const ReferenceTransformer& src, int32_t n_prefix);

  int32_t position() const { return pos_; }
  int32_t max_context() const { return max_ctx_; }
  int32_t n_vocab() const { return w_.config.n_vocab; }
  // Drops KV entries at positions >= p. Throws if p > position() or p < 0.
  void rewind(int32_t p);
  // The cached K (RoPE applied) and V of layer l at position p < max_context()
  // (n_head_kv * head_dim floats each), for tests.
  std::span<const float> k_row(int32_t l, int32_t p) const;
  std::span<const float> v_row(int32_t l, int32_t p) const;

  // Layer taps (backend_abi.h, ABI v4). While enabled, forward() records for the
  // token it runs, per layer: the attention output and the FFN output (what is
  // added to the residual stream) and the residual stream after the layer,
  // [n_layer][kTapPoints][n_embd] float32. taps() is empty until a token ran
  // with taps enabled; disabling clears it.
  static constexpr int kTapPoints = 3;
  void set_taps(bool enable);
  const std::vector<float>& taps() const { return taps_; }

 private:
  // What step_batch sets for one entry's prefill (all zero / null outside it).
  struct BatchFaults {
    int slices = 0;                                   // batch_token_count_split
    int32_t rope_offset = 0;                          // batch_position_offset
    const ReferenceTransformer* leak_from = nullptr;  // batch_kv_leak
  };
  void prefill_in_batch(std::span<const int32_t> tokens, bool all_positions,
                        std::span<float> logits, const BatchFaults& batch);
  void attention(int32_t l, int32_t pos);
  void attend_head(int32_t l, int32_t h, int32_t t0, int32_t n_kv);
  void feed_forward(int32_t l);
  float* k_layer(int32_t l) const;
  float* v_layer(int32_t l) const;

  const ModelWeights& w_;
  Faults faults_;
  int32_t max_ctx_ = 0;
  int32_t pos_ = 0;
  int32_t kv_len_ = 0;  // rewind_noop fault: entries [0, kv_len_) are attended
  int n_threads_ = 1;   // as given to the constructor (fork)
  // causal_mask fault: attention at any position also reads the KV entries up
  // to chunk_end_ (exclusive), the end of the prefill chunk being run.
  int32_t chunk_end_ = 0;
  // RoPE rotates position p as p - rope_origin_ (0 without a fault). Faults:
  // prefill_position_reset (origin = the prefill's first position, so a
  // continuing prefill numbers its tokens from 0) and batch_position_offset
  // (origin = -(tokens of the step_batch entries before this one)).
  int32_t rope_origin_ = 0;
  // batch_kv_leak fault, inside step_batch only: the previous entry's
  // transformer, whose newest KV entry of each layer every attention here also
  // reads, as if it were the entry before position 0. Null otherwise.
  const ReferenceTransformer* leak_from_ = nullptr;
  RowPool pool_;
  bool taps_on_ = false;
  std::vector<float> taps_;
  // KV cache, zero-initialised by calloc: pages no position reached cost no
  // memory and no time (a session sized for 8192 positions used to zero-fill
  // ~380 MB for SmolLM2 at open).
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], FreeDeleter>
      k_cache_;  // [n_layer][max_ctx][n_head_kv*head_dim], RoPE applied
  std::unique_ptr<float[], FreeDeleter> v_cache_;  // [n_layer][max_ctx][n_head_kv*head_dim]
  // Scratch activations, allocated once: x (residual), xn (normed), q, k, v, att_out, gate, up.
  std::vector<float> x_, xn_, q_, k_, v_, att_out_, gate_, up_;
  std::vector<double> scores_;  // [max_ctx] attention scores of one head
};

}  // namespace touchstone
