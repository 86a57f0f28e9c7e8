// vk_forward.h - one sequence on the device: activations, KV cache and the
// forward graph (same formulas as reference/model/src/reference_forward.cpp, fp32
// accumulation). Tokens run in chunks of up to kChunk positions per command
// buffer; only logits come back to the host.
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
  int32_t position() const { return pos_; }
  int32_t max_context() const { return max_ctx_; }
  int32_t n_vocab() const { return w_.config.n_vocab; }

 private:
  void check_room(int32_t n) const;
  // argmax: also write the argmax of the last position into argmax_.
  void run_chunk(const int32_t* tokens, uint32_t n, bool all_positions, float* logits,
                 bool argmax = false);
  void record(Recorder& r, uint32_t n, bool all_positions, bool want_logits, bool argmax);
  void record_layer(Recorder& r, size_t l, uint32_t n);

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
  Buffer x_, xn_, q_, k_buf_, v_, att_, gate_, up_, scores_, rope_;
  Buffer tokens_, logits_, argmax_;  // host-visible
  std::vector<Buffer> kc_, vc_;      // per layer [max_ctx][n_head_kv * head_dim], RoPE applied
};

}  // namespace touchstone::vk
