// vk_kernels.h - compute pipelines built from the embedded SPIR-V, descriptor
// sets (cached per buffer combination) and a command recorder.
//
// Every kernel binds only storage buffers (bindings 0..n-1) and takes its
// sizes and offsets as push constants, so a session's descriptor sets are
// created once and reused for every token.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "touchstone/model/gguf.h"
#include "vk_buffer.h"
#include "vk_context.h"
#include "vk_profile.h"

namespace touchstone::vk {

struct Kernel {
  std::string name;
  uint32_t n_bindings = 0;
  uint32_t push_size = 0;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
};

// The faults of the catalog that live in the shaders: the values of the
// specialization constants of shaders/faults.glsl, constant_id i at byte 4 i
// (bools as VkBool32). A default-constructed one is the correct shaders.
struct ShaderFaults {
  uint32_t rope_layout = 0;     // 0 FAULT_ROPE_LAYOUT
  uint32_t kv_write_next = 0;   // 1 FAULT_KV_WRITE_NEXT
  uint32_t gqa_mapping = 0;     // 2 FAULT_GQA_MAPPING
  uint32_t softmax_no_max = 0;  // 3 FAULT_SOFTMAX_NO_MAX
  uint32_t causal_mask = 0;     // 4 FAULT_CAUSAL_MASK
  uint32_t fp16_out = 0;        // 5 FAULT_FP16_OUT
  uint32_t split_k = 1;         // 6 FAULT_SPLIT_K
  uint32_t nibble_order = 0;    // 7 FAULT_NIBBLE_ORDER
  uint32_t scale_min_swap = 0;  // 8 FAULT_SCALE_MIN_SWAP
  static constexpr uint32_t kCount = 9;
  bool any() const;
};

// Weight types the shaders read in place (others are dequantized to fp32 on the host).
bool shader_reads(gguf::TensorType t);
const char* shader_type_suffix(gguf::TensorType t);  // "f32", "q4_1", ...

class Kernels {
 public:
  // faults: built into every pipeline as specialization constants (only a
  // session opened with such a fault builds its own Kernels with them).
  explicit Kernels(Context& ctx, const ShaderFaults& faults = {});
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  // rows: matmul_rows.comp (n_tok == 1: its one-token variant), else matmul.comp.
  const Kernel& matmul(gguf::TensorType t, uint32_t n_tok, bool rows) const;
  const Kernel& get_rows(gguf::TensorType t) const;
  const Kernel& rms_norm() const { return get("rms_norm", true); }
  // attention_rows.comp on CPU devices when head_dim is one of kAttentionRowsHeadDims, else
  // attention.comp.
  const Kernel& attention(uint32_t head_dim) const;
  const Kernel& rope_store() const { return get("rope_store", false); }
  const Kernel& glu() const { return get("glu", false); }
  const Kernel& argmax() const { return get("argmax", false); }
  const Kernel& bias_add() const { return get("bias_add", false); }
  const Kernel& add() const { return get("add", false); }
  const Kernel& softcap() const { return get("softcap", false); }
  const Kernel& copy() const { return get("copy", false); }
  const Kernel& moe_gather() const { return get("moe_gather", false); }
  const Kernel& moe_sum() const { return get("moe_sum", false); }
  Context& context() const { return ctx_; }
  // matmul strategy: matmul_rows.comp (CPU devices) instead of one workgroup per row.
  bool matmul_row_per_invocation() const { return rows_; }

 private:
  const Kernel& get(const std::string& base, bool has_subgroup_variant) const;
  void add(const std::string& shader, uint32_t n_bindings, uint32_t push_size);
  Context& ctx_;
  ShaderFaults faults_;
  bool rows_ = false;
  std::map<std::string, Kernel> kernels_;
};

// Descriptor sets keyed by (kernel, buffers); grows pools as needed.
class DescriptorCache {
 public:
  explicit DescriptorCache(Context& ctx) : ctx_(ctx) {}
  ~DescriptorCache();
  DescriptorCache(const DescriptorCache&) = delete;
  DescriptorCache& operator=(const DescriptorCache&) = delete;
  VkDescriptorSet get(const Kernel& k, const std::vector<BufferRange>& buffers);

 private:
  Context& ctx_;
  std::vector<VkDescriptorPool> pools_;
  uint32_t left_in_pool_ = 0;
  std::map<std::pair<const Kernel*, std::vector<uint64_t>>, VkDescriptorSet>
      sets_;  // by (Buffer::serial(), offset, size) of each binding
};

// Records dispatches into one command buffer.
class Recorder {
 public:
  // prof: optional, times every dispatch (TOUCHSTONE_VULKAN_PROFILE=1).
  Recorder(VkCommandBuffer cb, DescriptorCache& sets, Profiler* prof = nullptr)
      : cb_(cb), sets_(sets), prof_(prof) {}
  template <typename Push>
  void dispatch(const Kernel& k, const std::vector<BufferRange>& buffers, const Push& push,
                uint32_t gx, uint32_t gy = 1, uint32_t gz = 1) {
    dispatch_raw(k, buffers, &push, sizeof(Push), gx, gy, gz);
  }
  // Shader writes before -> shader reads/writes after.
  void barrier();
  // Shader writes before -> host reads after the fence.
  void host_barrier();
  VkCommandBuffer handle() const { return cb_; }
  // Records into cb from now on (the commands so far were submitted: a
  // mixture-of-experts layer reads its router logits on the host mid-pass).
  void restart(VkCommandBuffer cb) { cb_ = cb; }
  // A recorder into the same command buffer whose descriptor sets come from
  // `sets` (a batched pass binds each sequence's KV cache through its own cache).
  Recorder with(DescriptorCache& sets) const { return Recorder(cb_, sets, prof_); }

 private:
  void dispatch_raw(const Kernel& k, const std::vector<BufferRange>& buffers, const void* push,
                    size_t push_size, uint32_t gx, uint32_t gy, uint32_t gz);
  VkCommandBuffer cb_;
  DescriptorCache& sets_;
  Profiler* prof_;
};

// ---- push constants, mirrored from the shaders ---------------------------------
struct MatmulPush {
  uint32_t n_in, n_out, n_tok, x_off, x_stride, y_off, y_stride, accumulate;
};
struct GetRowsPush {
  uint32_t n, n_tok, out_off, n_rows;
  float scale;    // embedding multiplier (ModelConfig::embd_scale)
  uint32_t row0;  // W holds rows [row0, row0 + n_rows) of the table; other tokens are skipped
};
struct RmsNormPush {
  uint32_t n, n_tok, x_off, x_stride, out_off, out_stride;
  float eps;
};
struct RopeStorePush {
  uint32_t n_tok, pos0, n_head, n_head_kv, hd;
  uint32_t rope_origin;  // 0; the prefill_position_reset fault: RoPE rotates pos - rope_origin
  uint32_t n_rot;        // rotated dims per head (<= hd; partial rotary below)
  uint32_t neox;         // 1: NeoX pairs (i, i + n_rot/2), 0: interleaved (2i, 2i + 1)
  uint32_t row0 = 0;     // first row of the sequence in Q/K/V (a batched pass holds several)
};
struct AttentionPush {
  uint32_t n_tok, pos0, n_head, n_head_kv, hd, max_ctx, drop_newest;
  float scale;
  // KV entries filled, this chunk included: token t attends kv_len - (n_tok - 1 - t).
  uint32_t kv_len;
  uint32_t window;           // sliding window W (positions pos - W + 1 .. pos), 0 = full causal
  uint32_t row0 = 0;         // first row of the sequence in Q, O and the scratch (batched passes)
  uint32_t sinks = 0;        // 1: a per-head sink logit joins the softmax (gpt-oss; binding 5)
  uint32_t whole_chunk = 0;  // 1: every row attends kv_len (a bidirectional image block)
};
struct GluPush {
  uint32_t n, act;  // elements; 0: SwiGLU, 1: GeGLU (tanh GELU), 2: gpt-oss's clamped SwiGLU
  float alpha = 0.0f, limit = 0.0f;  // act 2: swiglu_alpha, swiglu_limit
};
struct BiasAddPush {
  uint32_t n, n_tok;              // row length, rows
  uint32_t y_off = 0, b_off = 0;  // first element of y and of b (an expert's rows and bias)
};
struct AddPush {
  uint32_t n;
};
struct SoftcapPush {
  uint32_t n, off;
  float cap;
};
struct CopyPush {
  uint32_t n, src_off, dst_off;  // floats
};
struct MoeGatherPush {
  uint32_t n, n_rows, row_off;  // row length, grouped rows, their tokens' offset in route
};
struct MoeSumPush {
  uint32_t n, n_tok, k;     // row length, rows, experts per token
  uint32_t pos_off, w_off;  // offsets in route of the slots' grouped rows and weights
  uint32_t has_shared = 0;  // 1: add sigma[t] * sh[t][c] (the shared expert, qwen2moe)
  uint32_t sig_off = 0;     // offset in route of the rows' sigmas (fp32 bits)
};
struct ArgmaxPush {
  uint32_t n, off;  // argmax of x[off .. off + n); one workgroup
};

inline constexpr uint32_t kMatmulTile = 8;  // tokens per matmul workgroup (TILE in matmul*.comp)
// matmul_rows.comp: 8 invocations x 4 rows (LANES x ROWS) per workgroup.
inline constexpr uint32_t kMatmulRowsPerGroup = 32;
// HD of the attention_rows.comp variants (attention_rows_<HD>).
inline constexpr uint32_t kAttentionRowsHeadDims[] = {64, 128, 256};
inline constexpr uint32_t kWorkgroup = 64;          // WG in common.glsl
inline constexpr uint32_t kMatmulRowsPerX = 32768;  // matmul.comp: o = group.x + group.z * 32768

// Records Y (+)= W X with the right kernel and grid: matmul_rows.comp when the
// context uses that strategy and n_in % 32 == 0, x_off % 4 == 0, x_stride % 4
// == 0; otherwise matmul.comp.
void record_matmul(Recorder& r, const Kernels& k, gguf::TensorType wtype, const BufferRange& w,
                   const Buffer& x, const Buffer& y, const MatmulPush& p);

}  // namespace touchstone::vk
