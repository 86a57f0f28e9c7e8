// vk_forward.h - one sequence on the device: activations, KV cache and the
// forward graph of any ModelConfig family (same formulas as
// reference/model/src/reference_forward.cpp, fp32 accumulation; the graph is
// recorded in vk_graph.cpp). Tokens run in chunks of up to kChunk positions per
// command buffer; only logits (and, when enabled, the layer taps) come back to
// the host.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "touchstone/reference_forward.h"
#include "vk_buffer.h"
#include "vk_kernels.h"
#include "vk_weights.h"

namespace touchstone::vk {

class Forward {
 public:
  static constexpr int32_t kChunk = 32;

  // max_context <= 0: the model's context_length. faults: the test-only fault
  // (docs/backends/vulkan.md#fault-catalog); one that lives in the shaders
  // makes the session build its own pipelines. n_threads (the session option)
  // is read only by the thread_order_reduction fault.
  Forward(Context& ctx, const Kernels& kernels, const DeviceWeights& weights, int32_t max_context,
          Faults faults, int32_t n_threads = 0);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // Appends n tokens at position(); writes n_vocab logits of the last position,
  // or n * n_vocab (row-major) when all_positions. Throws StatusError.
  void run(const int32_t* tokens, int32_t n, bool all_positions, float* logits);
  // Appends n tokens like run() and returns the greedy next token: the argmax
  // of the last position's logits (NaN skipped, ties to the lowest id; every
  // logit NaN: TS_ERR_INTERNAL), computed on the device; logits are not copied
  // back (except under the logits_perturb fault, applied on the host). Throws
  // StatusError.
  int32_t greedy(const int32_t* tokens, int32_t n);
  // Entries >= p are overwritten before being read (the rewind_noop fault keeps
  // kv_len_, so attention reads them again).
  void rewind(int32_t p) {
    pos_ = p;
    if (!faults_.rewind_noop) kv_len_ = p;
  }
  // Layer taps (backend_abi.h, ABI v4): while on, every run()/greedy() call
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
  // The graph (vk_graph.cpp). tap: record the last row's taps into taps_buf_.
  void record(Recorder& r, uint32_t n, bool all_positions, bool want_logits, bool argmax, bool tap);
  void record_attention(Recorder& r, size_t l, uint32_t n, bool tap);
  void record_ffn(Recorder& r, size_t l, uint32_t n, bool tap);
  // x_ += post_norm(W in) (post_norm: an empty Buffer for none); with tap, row
  // n - 1 of the block output goes to tap point `point` of layer l.
  void record_block_out(Recorder& r, const DeviceMatrix& W, const Buffer& in,
                        const Buffer& post_norm, uint32_t n, bool tap, size_t l, uint32_t point);
  void record_tap(Recorder& r, const Buffer& src, uint32_t row, size_t l, uint32_t point);
  void build_rope_tables();

  Context& ctx_;
  std::unique_ptr<Kernels> fault_kernels_;  // a fault in the shaders: this session's pipelines
  const Kernels& k_;                        // fault_kernels_ or the model's
  const DeviceWeights& w_;
  Faults faults_;
  int32_t max_ctx_ = 0;
  int32_t pos_ = 0;
  int32_t kv_len_ = 0;        // KV entries filled: pos_, or more after a rewind under rewind_noop
  uint32_t rope_origin_ = 0;  // prefill_position_reset fault: RoPE rotates pos - origin
  DescriptorCache sets_;
  std::unique_ptr<Profiler> prof_;  // TOUCHSTONE_VULKAN_PROFILE=1
  Buffer x_, xn_, q_, k_buf_, v_, att_, gate_, up_, scores_, blk_;
  Buffer tokens_, logits_, argmax_, taps_buf_;  // host-visible
  std::vector<Buffer> kc_, vc_;  // per layer [max_ctx][n_head_kv * head_dim], RoPE applied
  // RoPE (cos, sin) tables, one per distinct (base, scale) of the layers, and
  // each layer's table: [max_ctx][n_rot / 2] vec2.
  std::vector<Buffer> rope_tables_;
  std::vector<size_t> rope_of_layer_;
  bool taps_on_ = false;
  std::vector<float> taps_;
};

}  // namespace touchstone::vk
