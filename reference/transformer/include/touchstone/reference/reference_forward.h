// touchstone/reference/reference_forward.h - the scalar reference transformer, every family.
//
// One token at a time, plain loops, fp64 accumulators, the model described as data
// (ModelConfig); see reference_forward.cpp for the formulas and touchstone/model/scalar_ops.h
// for the exact accumulation order. This is the definition of "right" that every
// backend is compared with.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/model/faults.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/row_pool.h"

namespace touchstone {

class ReferenceTransformer {
 public:
  // max_context: KV cache capacity in tokens (<= 0: the model's context_length).
  // n_threads: rows of each matrix-vector product are split across threads;
  // the result is bitwise identical for any thread count.
  // `weights` (matrices as stored in their GGUF file, each row dequantized where it is
  // used) must outlive the transformer.
  ReferenceTransformer(const StoredWeights& weights, int32_t max_context, int n_threads,
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

  // Runs n caller-supplied input embeddings (n x n_embd float32, row-major; e.g. an
  // image's tokens from the vision tower, touchstone/vision/vision_tower.h: used as they
  // are, without the token embedding's scale, as HF Gemma3Model's masked_scatter places
  // them) at positions position() .. position() + n - 1, and writes their logits (the
  // last row, or all n rows when all_positions). bidirectional: each of the n also
  // attends to the later ones (Gemma 3's image blocks: HF's token_type_ids mask, OR'ed
  // with the causal mask and ANDed with a layer's sliding window), else causally, as n
  // tokens would. Layer by layer: every row's K/V is written before any row attends.
  // Taps are not recorded. Throws touchstone::Error when n < 1, the cache lacks room,
  // or a buffer has another size.
  void prefill_embeddings(std::span<const float> embeddings, int32_t n, bool bidirectional,
                          bool all_positions, std::span<float> logits);

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
  void attention_qkv(int32_t l, int32_t pos);
  void attention_out(int32_t l, int32_t pos, int32_t visible_end);
  void finish_position(std::span<float> logits);
  void attend_head(int32_t l, int32_t h, int32_t t0, int32_t n_kv);
  void feed_forward(int32_t l);
  void moe_feed_forward(int32_t l);
  // One gated FFN's matrices (as stored) and optional biases (null: none).
  struct ExpertMatrices {
    WeightMatrix gate;
    WeightMatrix up;
    WeightMatrix down;
    const float* gate_b = nullptr;
    const float* up_b = nullptr;
    const float* down_b = nullptr;
  };
  void gated_ffn(const ExpertMatrices& m, int64_t n_ff, float* out);
  float* k_layer(int32_t l) const;
  float* v_layer(int32_t l) const;

  const StoredWeights& w_;
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
  // Mixture-of-experts layers only: router logits [n_expert], one expert's output
  // [n_embd], the weighted sum of the experts' outputs [n_embd] (fp64).
  std::vector<float> router_, expert_out_;
  std::vector<double> moe_sum_;
};

}  // namespace touchstone
