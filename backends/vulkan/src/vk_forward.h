// vk_forward.h - sequences on the device: activations, KV caches and the
// forward graph of any ModelConfig family (same formulas as
// reference/transformer/src/reference_forward.cpp, fp32 accumulation; the graph is
// recorded in vk_graph.cpp). A pass computes up to kChunk token rows in one
// command buffer: one sequence's chunk (prefill(), prefill_greedy()) or the rows of several
// sequences (step_batch(), vk_batch.cpp: every matmul over all their rows,
// RoPE, KV store and attention per sequence against its own KV cache). Only
// logits (and, when enabled, the layer taps) come back to the host.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "touchstone/model/faults.h"
#include "touchstone/model/model_weights.h"
#include "vk_buffer.h"
#include "vk_kernels.h"
#include "vk_weights.h"

namespace touchstone::vk {

class Forward;

// The activation buffers of a pass of up to `rows` token rows. scores: the
// attention scratch, rows * n_head rows of score_stride floats (score_stride >=
// every attended sequence's KV length).
struct Activations {
  Activations(Context& ctx, const ModelConfig& c, uint32_t rows, uint32_t score_stride);
  // Grows the attention scratch to rows of at least `stride` floats.
  void reserve_scores(Context& ctx, const ModelConfig& c, uint32_t stride);
  uint32_t rows = 0, score_stride = 0;
  Buffer x, xn, q, k, v, att, gate, up, blk, scores;  // device
  Buffer tokens, logits, embd;  // host-visible (embd: ABI v8 input embeddings, [rows][n_embd])
  // Mixture-of-experts models only (vk_moe.cpp), S = rows * n_expert_used slots:
  // moe_x the grouped input rows and moe_out the expert outputs ([S][n_embd],
  // device; gate and up then hold [S][n_ff_exp]); router the router logits
  // ([rows][n_expert], host-visible); route (host-visible, uint32) the token of
  // each grouped row [0, S), the grouped row of each slot [S, 2 S) and each slot's
  // weight as fp32 bits [2 S, 3 S).
  // With a shared expert (qwen2moe): moe_shared its output ([rows][n_embd], device),
  // shexp_logit its gate logits ([rows], host-visible); route then also holds each
  // row's sigmoid of that logit (fp32 bits) after its 3 sections.
  Buffer moe_x, moe_out, router, route, moe_shared, shexp_logit;
};

// The shared buffers of batched passes over one model and weight path
// (step_batch): one per DeviceWeights, so descriptor sets stay bounded (each
// session caches the sets that bind its KV cache to these buffers).
struct BatchWorkspace {
  BatchWorkspace(Context& ctx, const ModelConfig& c);
  std::mutex mutex;  // one batched pass at a time
  Activations act;
  DescriptorCache sets;  // the dispatches that bind no session's buffers
};

// One sequence's rows [row0, row0 + n) of a pass.
struct Segment {
  Forward* f = nullptr;        // whose KV cache, RoPE tables and taps
  uint32_t row0 = 0, n = 0;    // rows of the pass
  uint32_t pos0 = 0;           // position of its first token
  uint32_t rope_origin = 0;    // RoPE rotates pos - rope_origin (uint32 wrap-around)
  uint32_t kv_len = 0;         // KV entries attended by its last token
  uint32_t out_rows = 0;       // logits rows: 0, 1 (its last token) or n
  uint32_t out_row0 = 0;       // their first row in the pass's logits
  bool tap = false;            // record its last row's layer taps into f's taps
  bool bidirectional = false;  // ABI v8: its rows attend the whole segment (an image block)
  // batch_page_boundary_leak fault: entry i-1's sequence, whose KV row at a
  // page boundary in this segment replaces this sequence's own for the attention
  const Forward* page_from = nullptr;
};

// One pass: the segments' rows in `act`, dispatches not bound to a session
// through `sets`.
struct Pass {
  Activations& act;
  DescriptorCache& sets;
  std::span<const Segment> segs;
  uint32_t n = 0;         // rows
  uint32_t out_rows = 0;  // logits rows (the segments' out_rows)
  bool argmax = false;    // also the argmax of the last logits row into argmax_
  bool tap = false;       // some segment records taps
  bool embd = false;      // ABI v8: the rows' inputs are act.embd, not token ids
};

// One sequence's share of step_batch (already checked by the adapter).
struct BatchEntry {
  Forward* f = nullptr;
  const int32_t* tokens = nullptr;
  int32_t n = 0;
  bool all_positions = false;
  float* logits = nullptr;  // n_vocab floats, or n * n_vocab when all_positions
};

class Forward {
 public:
  static constexpr int32_t kChunk = 32;

  // max_context <= 0: the model's context_length. faults: the test-only fault
  // (docs/backends/vulkan.md#fault-catalog); one that lives in the shaders
  // makes the session build its own pipelines. n_threads (the session option)
  // is read only by the thread_order_reduction fault.
  Forward(Context& ctx, const Kernels& kernels, const DeviceWeights& weights, int32_t max_context,
          Faults faults, int32_t n_threads = 0);
  // ABI v6 fork_session: a new sequence with this one's options whose KV cache
  // holds this one's first n_prefix positions (copied on the device);
  // 0 <= n_prefix <= position() (the adapter checks). The fork_short_copy
  // fault copies n_prefix - 1 entries and zeroes the last; fork_shared_kv
  // shares this sequence's KV buffers (every write lands in both).
  std::unique_ptr<Forward> fork(int32_t n_prefix) const;
  // ABI v6 step_batch: each entry appends its tokens exactly as prefill() would,
  // in passes of up to kChunk rows over all entries (vk_batch.cpp). Entries
  // whose faults differ from entry 0's run one by one. Throws StatusError.
  static void step_batch(BatchWorkspace& ws, std::span<const BatchEntry> entries);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // Appends n tokens at position(); writes n_vocab logits of the last position,
  // or n * n_vocab (row-major) when all_positions. Throws StatusError.
  void prefill(const int32_t* tokens, int32_t n, bool all_positions, float* logits);
  // Appends n tokens like prefill() and returns the greedy next token: the argmax
  // of the last position's logits (NaN skipped, ties to the lowest id; every
  // logit NaN: TS_ERR_INTERNAL), computed on the device; logits are not copied
  // back (except under the logits_perturb fault, applied on the host). Throws
  // StatusError.
  int32_t prefill_greedy(const int32_t* tokens, int32_t n);
  // ABI v8: n input embeddings (n x n_embd float32, used as given) appended as prefill()
  // appends tokens; bidirectional: the block attends both ways, so it is one pass of all
  // its rows (beyond kChunk rows in buffers of its size, block_act_).
  void prefill_embeddings(const float* embd, int32_t n, bool bidirectional, bool all_positions,
                          float* logits);
  int32_t n_embd() const { return w_.config.n_embd; }
  // Entries >= p are overwritten before being read (the rewind_noop fault keeps
  // kv_len_, so attention reads them again).
  void rewind(int32_t p) {
    pos_ = p;
    if (!faults_.rewind_noop) kv_len_ = p;
  }
  // Layer taps (backend_abi.h, ABI v4): while on, every prefill()/prefill_greedy() call
  // records the last position's TS_TAP_POINTS vectors of n_embd floats per
  // layer; taps() is [n_layer][TS_TAP_POINTS][n_embd] float32, empty until a
  // call ran with taps on (turning them on or off clears it). Recording keeps
  // every block output apart before its residual add (the same fp32 sum), so
  // logits are bitwise unchanged.
  void set_taps(bool on) {
    taps_on_ = on;
    taps_.clear();
  }
  const std::vector<float>& taps() const { return taps_; }
  int32_t position() const { return pos_; }
  int32_t max_context() const { return max_ctx_; }
  int32_t n_vocab() const { return w_.config.n_vocab; }

 private:
  void check_room(int32_t n) const;
  // argmax: also write the argmax of the last position into argmax_. last: the
  // call's last chunk (records the layer taps when they are on).
  void run_chunk(const int32_t* tokens, uint32_t n, bool all_positions, float* logits, bool argmax,
                 bool last);
  // in_batch: an entry of a step_batch of two or more (batch_all_positions_shift).
  void shift_rows(int32_t start, int32_t n, bool all_positions, float* logits,
                  bool in_batch = false) const;
  // This sequence's segment for n tokens at pos_ (rope_origin_, kv_len_).
  Segment segment(uint32_t row0, uint32_t n, uint32_t out_rows, uint32_t out_row0, bool tap);
  // Records pass p and runs it (one command buffer), then advances every
  // segment's sequence and copies the layer taps of the segments that record them.
  void run_pass(const int32_t* tokens, const Pass& p);
  // The segment's logits rows of the last pass (p.act.logits), the
  // logits_perturb fault applied, into out.
  void copy_logits(const Pass& p, const Segment& s, float* out) const;
  // The graph (vk_graph.cpp), with this sequence's kernels and faults.
  void record(Recorder& r, const Pass& p);
  void record_attention(Recorder& r, const Pass& p, size_t l);
  // batch_page_boundary_leak fault: each segment's page-boundary KV row of layer
  // l swapped for its page_from's (restore: swapped back after the attention).
  void record_page_leak(Recorder& r, const Pass& p, size_t l, bool restore) const;
  void record_ffn(Recorder& r, const Pass& p, size_t l);
  // Layer l's mixture of experts on the normed rows in xn, output into blk
  // (vk_moe.cpp): the router logits come back to the host (flush) and are routed
  // there (route_rows), then the selected experts' FFNs and their weighted sum.
  void record_moe(Recorder& r, const Pass& p, size_t l);
  // The shared expert of a qwen2moe layer (vk_moe.cpp): its sigmas on the host, its
  // FFN on the device into a.moe_shared.
  void shared_sigmas(const Activations& a, uint32_t n) const;
  void record_gate_up_act(Recorder& r, const Pass& p, const DeviceMatrix& gate,
                          const DeviceMatrix& up, uint32_t n_ff, uint32_t act);
  void record_shared_expert(Recorder& r, const Pass& p, size_t l);
  // The pass's n rows routed from a.router (+ router_b: gpt-oss) into a.route
  // (ops::route_softmax_top_k, gpt-oss ops::route_top_k_softmax); returns, per expert
  // e, its grouped rows [first[e], first[e + 1]).
  std::vector<uint32_t> route_rows(const Activations& a, uint32_t n,
                                   const std::vector<float>& router_b) const;
  // gpt-oss: each expert's bias rows added to its grouped rows (vk_moe.cpp).
  void record_expert_biases(Recorder& r, Activations& a, const std::vector<uint32_t>& first,
                            const Buffer& b0, const Buffer& b1, uint32_t n);
  // Submits what r recorded and waits for it; r continues in a new command buffer.
  void flush(Recorder& r);
  // x += post_norm(blk) (post_norm: an empty Buffer for none), the block output
  // tapped as record_block_out does.
  void record_residual_add(Recorder& r, const Pass& p, const Buffer& post_norm, size_t l,
                           uint32_t point);
  // x += post_norm(W in) (post_norm: an empty Buffer for none); with p.tap, each
  // tapping segment's last row of the block output goes to tap point `point` of layer l.
  // bias: added to W in before the residual add (gpt-oss's attention output bias); an
  // empty Buffer for none.
  void record_block_out(Recorder& r, const Pass& p, const DeviceMatrix& W, const Buffer& in,
                        const Buffer& post_norm, size_t l, uint32_t point,
                        const Buffer& bias = Buffer());
  // Row `row` of src into segment s's taps, point `point` of layer l.
  void record_tap(Recorder& r, const Segment& s, const Buffer& src, uint32_t row, size_t l,
                  uint32_t point);
  void record_taps(Recorder& r, const Pass& p, const Buffer& src, size_t l, uint32_t point);
  void record_logits(Recorder& r, const Pass& p);
  void build_rope_tables();

  Context& ctx_;
  const Kernels& base_kernels_;             // the model's (a fork starts from them)
  std::unique_ptr<Kernels> fault_kernels_;  // a fault in the shaders: this session's pipelines
  const Kernels& k_;                        // fault_kernels_ or the model's
  const DeviceWeights& w_;
  Faults faults_;
  int32_t n_threads_ = 0;
  int32_t max_ctx_ = 0;
  int32_t pos_ = 0;
  int32_t kv_len_ = 0;        // KV entries filled: pos_, or more after a rewind under rewind_noop
  uint32_t rope_origin_ = 0;  // prefill_position_reset fault: RoPE rotates pos - origin
  DescriptorCache sets_;
  std::unique_ptr<Profiler> prof_;  // TOUCHSTONE_VULKAN_PROFILE=1
  Activations act_;                 // this sequence's own passes
  // A bidirectional block of more than kChunk rows (prefill_embeddings): one pass of
  // all its rows in buffers of its size, made on first use and grown as needed.
  std::unique_ptr<Activations> block_act_;
  Buffer argmax_, taps_buf_;  // host-visible
  // Per layer [max_ctx][n_head_kv * head_dim], RoPE applied. Owned by this
  // sequence alone, except under the fork_shared_kv fault.
  struct KvCache {
    std::vector<Buffer> k, v;
  };
  std::shared_ptr<KvCache> kv_;
  Buffer page_save_;  // batch_page_boundary_leak fault: the swapped-out K and V rows
  // RoPE (cos, sin) tables, one per distinct (base, scale) of the layers, and
  // each layer's table: [max_ctx][n_rot / 2] vec2.
  std::vector<Buffer> rope_tables_;
  std::vector<size_t> rope_of_layer_;
  bool taps_on_ = false;
  std::vector<float> taps_;
};

}  // namespace touchstone::vk
