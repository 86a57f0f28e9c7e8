// touchstone/model/faults.h - the fault catalog: deliberate implementation bugs that
// prove the parity harness can fail (docs/metrics.md#fault-catalog-and-margins).
//
// One table (faults.cpp) holds every name and what it sets; every backend parses
// names with parse_fault() and implements the faults it can, refusing the rest
// with TS_ERR_UNSUPPORTED. Adding a fault is an entry there, a member here, and
// its effect in the backends that implement it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // Serving faults that escaped the checks before issue 37 (written without the
  // catalog, planted in cpu_simd; docs/serving-checks.md#faults-each-check-catches):
  bool fork_shared_kv = false;  // "fork_shared_kv": fork_session shares the source's KV rows
                                // instead of copying them (the fork's writes land in the
                                // source's cache and in its siblings') (prefix_fork)
  bool batch_all_positions_shift = false;  // "batch_all_positions_shift": in a step_batch of
                                           // two or more entries, an all-position entry
                                           // returns row i-1 as row i (batch_invariance)
  bool batch_page_boundary_leak = false;   // "batch_page_boundary_leak": in step_batch, entry
                                           // i > 0 reads the newest KV row of a token at a
                                           // page boundary (position p > 0, p % kFaultPageRows
                                           // == 0) from entry i-1's cache (batch_invariance)
  static constexpr int32_t kFaultPageRows = 32;  // batch_page_boundary_leak's page size
  // Structured-output faults (ABI v7; in the grammar a backend enforces itself,
  // one structured check each, docs/structured-output.md#faults):
  bool grammar_mask_late = false;   // "grammar_mask_one_step_late": grammar_mask and
                                    // grammar_greedy use the allowed set of the previous
                                    // position (mask_parity, constrained_greedy)
  bool grammar_straddle = false;    // "grammar_straddling_token": a token is allowed when its
                                    // first byte alone would be, though its other bytes cross
                                    // the lexeme's end (mask_parity)
  bool grammar_early_stop = false;  // "grammar_early_stop": stop tokens allowed before the
                                    // grammar is in an accepting state (termination)
  bool grammar_draft_advance =
      false;  // "grammar_advanced_on_rejected_draft": rewind and fork leave the grammar where
              // the rejected drafts took it (speculative, rollback)
  bool grammar_batch_mask = false;  // "grammar_mask_shared_in_batch": in step_batch, the
                                    // allowed set of the first entry with a grammar is
                                    // applied to every other entry's logits (vLLM PR
                                    // 22896's shared bitmask) (batch_isolation)
  // Mixture-of-experts faults (the reference; caught by the routing diagnosis,
  // docs/metrics.md#routing-divergence; a no-op on a dense model):
  bool moe_runner_up = false;       // "moe_runner_up": the router's k-th expert replaced by the
                                    // (k+1)-th, the runner-up (a routing divergence)
  bool moe_renorm_skipped = false;  // "moe_renorm_skipped": the top-k weights left as the
                                    // softmax gave them where the family renormalises
                                    // them (an expert weighting divergence)
  bool moe_softmax_order = false;   // "moe_softmax_order": the router's softmax on the other
                                    // side of the top-k (after it where the family takes it
                                    // before, and the reverse): the selected weights sum to
                                    // 1 where they should not, or not where they should (an
                                    // expert weighting divergence; the same maths where the
                                    // family renormalises, so a no-op there)
  bool moe_shared_expert_dropped = false;  // "moe_shared_expert_dropped": the shared expert's
                                           // gated output left out of the FFN (qwen2moe)
  // Attention-sink fault (gpt-oss; a no-op on a model without sinks):
  bool attention_sinks_ignored = false;  // "attention_sinks_ignored": the per-head sink logit
                                         // left out of the attention softmax (as a backend
                                         // that implements no sinks)
  // Multimodal faults (ABI v8 prefill_embeddings; caught by the image cases'
  // parity, docs/vision.md#faults; a no-op without image input):
  bool image_attended_causally = false;     // "image_attended_causally": an image block asked
                                            // to attend bidirectionally (Gemma 3) attended
                                            // causally, as text (llama.cpp's non-causal ubatch
                                            // missed)
  bool image_position_offset = false;       // "image_position_offset": the image's embeddings
                                            // rotated (RoPE) one position later than the
                                            // positions they occupy
  bool image_split_position_reset = false;  // "image_split_position_reset": a
                                            // prefill_embeddings call that continues the
                                            // previous one (an image cut into several
                                            // calls) rotates its rows from the image's
                                            // first position again, as an engine that
                                            // does not advance its position across an
                                            // image's batches; no effect when each image
                                            // block is one call (caught by
                                            // multimodal.consistency only)
  // Vision-path faults (ABI v9 set_vision_options: handed to the model's vision path,
  // never to a session; docs/vision.md#faults):
  bool image_resample_filter = false;      // "image_resample_filter": the processor's resize
                                           // with bilinear where it says bicubic or lanczos,
                                           // and bicubic where it says bilinear (llama.cpp
                                           // issue 24629) (multimodal.preprocess)
  bool projector_grid_transposed = false;  // "projector_grid_transposed": the projector reads
                                           // the tower's patch grid transposed, as a Gemma 3
                                           // pooling or Idefics3 pixel shuffle that swaps x
                                           // and y (multimodal.encoder)

  // The faults that corrupt only the quantized weight path (GGUF blocks).
  bool quantized_only() const { return quant_scale_min_swap || nibble_order; }
  // The structured-output faults (a backend that enforces no grammar refuses them).
  bool grammar() const {
    return grammar_mask_late || grammar_straddle || grammar_early_stop || grammar_draft_advance ||
           grammar_batch_mask;
  }
  // The mixture-of-experts faults (a backend that does not implement them refuses them).
  // Those of them that change the router's choice or weights.
  bool moe_router() const { return moe_runner_up || moe_renorm_skipped || moe_softmax_order; }
  bool moe() const {
    return moe_runner_up || moe_renorm_skipped || moe_softmax_order || moe_shared_expert_dropped;
  }
  // The multimodal faults (a backend that does not implement them refuses them).
  bool multimodal() const {
    return image_attended_causally || image_position_offset || image_split_position_reset;
  }
  // The vision-path faults: the harness hands them to BackendModel::set_vision_fault (ABI
  // v9), not to a session.
  bool vision_path() const { return image_resample_filter || projector_grid_transposed; }
  // The attention-sink faults (a backend that does not implement them refuses them).
  bool sinks() const { return attention_sinks_ignored; }
  // The serving faults (a backend without step_batch / fork_session refuses them).
  bool serving() const {
    return batch_token_count_split || batch_kv_leak || fork_short_copy || batch_position_offset ||
           verify_row_shift || fork_shared_kv || batch_all_positions_shift ||
           batch_page_boundary_leak;
  }
};

// Deterministic +-1 for the logit-noise fault ("logits_perturb_1e-3"): logit i of
// position p is multiplied by 1 + logit_noise * fault_noise_sign(p * n_vocab + i)
// (splitmix64 of the index, lowest bit), the same in every backend.
double fault_noise_sign(uint64_t i);

// Every fault name parse_fault knows, in catalog order.
const std::vector<std::string>& fault_names();

// Parses a fault name ("" = none). Throws touchstone::Error listing the known names.
Faults parse_fault(const std::string& name);

}  // namespace touchstone
