// vulkan_backend.cpp - the Vulkan backend behind the session contract
// (touchstone/abi/backend_abi.h) through touchstone::BackendAdapter, which applies
// the shared argument checks. Built as libtouchstone_backend_vulkan.so.
//
// load_model creates the Vulkan context (TS_ERR_DEVICE when there is no
// device) and the pipelines; weights are uploaded on the first session that
// asks for a weight path (full_precision: fp32, quantized: GGUF blocks) and
// shared by later sessions of that model.
#include <array>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "touchstone/abi/backend_impl.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/model/session_fault.h"
#include "vk_context.h"
#include "vk_forward.h"
#include "vk_kernels.h"
#include "vk_weights.h"

namespace {

using touchstone::abi::StatusError;

// The faults of the catalog this backend implements (docs/backends/vulkan.md,
// "Fault catalog"), by name: one added to the catalog later is refused until
// it is implemented here, never silently ignored. Of the serving faults,
// batch_token_count_split (a split-K set per call: a pipeline per batch size)
// and batch_kv_leak (a second sequence's KV cache bound into attention) are
// refused; so are the grammar faults (session_fault: no grammar enforced here).
// The mixture-of-experts faults are no-ops on a dense model.
bool implements_fault(const std::string& name) {
  static const char* const kImplemented[] = {"rope_base_off_1pct",
                                             "rope_layout",
                                             "kv_position_off_by_one",
                                             "kv_write_next",
                                             "gqa_mapping",
                                             "attention_scale",
                                             "softmax_no_max",
                                             "rms_eps_10x",
                                             "quant_scale_min_swap",
                                             "nibble_order",
                                             "fp16_accumulation",
                                             "rewind_noop",
                                             "causal_mask",
                                             "thread_order_reduction",
                                             "last_layer_skipped",
                                             "logits_perturb_1e-3",
                                             "logits_row_shift",
                                             "prefill_position_reset",
                                             "session_order_reduction",
                                             "fork_short_copy",
                                             "batch_position_offset",
                                             "verify_row_shift",
                                             "fork_shared_kv",
                                             "batch_all_positions_shift",
                                             "batch_page_boundary_leak",
                                             "moe_runner_up",
                                             "moe_renorm_skipped",
                                             "image_attended_causally"};
  for (const char* n : kImplemented)
    if (name == n) return true;
  return false;
}

// quant_scale_min_swap and nibble_order are bugs in the shaders' dequantization
// (shaders/quant.glsl): they reach the Q4_1 blocks (d and m) and the Q4_0/Q4_1
// quants read in place. A quantized session of a model with no such matrix
// refuses them (the other block types' dequantization carries no fault).
bool quant_fault_applies(const touchstone::vk::DeviceWeights& w, const touchstone::Faults& f) {
  using touchstone::gguf::TensorType;
  auto hit = [&](TensorType t) {
    return t == TensorType::Q4_1 || (f.nibble_order && t == TensorType::Q4_0);
  };
  auto hit_matrix = [&](const touchstone::vk::DeviceMatrix& m) { return m.n_out && hit(m.type); };
  if (hit_matrix(w.token_embd) || hit_matrix(w.output)) return true;
  for (const touchstone::vk::DeviceLayer& L : w.layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down, &L.router})
      if (hit_matrix(*m)) return true;
    for (const auto* e : {&L.gate_exps, &L.up_exps, &L.down_exps})  // mixture of experts
      if (!e->experts.empty() && hit(e->type)) return true;
  }
  return false;
}

// ABI v3: the families and features the graph computes (vk_graph.cpp; the
// mixture of experts `moe`, Mixtral-style, Qwen3-MoE and Qwen2-MoE with its shared
// expert: vk_moe.cpp;
// docs/model-families.md has the canonical names). gpt-oss (its architecture and
// its router, bias, sink and YaRN features) is not computed, so refused by name.
constexpr const char* kArchitectures = "llama,qwen2,qwen3,gemma3,phi3,qwen3moe,qwen2moe,gpt-oss";
constexpr const char* kModelFeatures =
    "neox_rope,partial_rotary,key_length_head_dim,rope_freqs,linear_rope_scaling,"
    "sliding_window,per_layer_rope_base,qkv_bias,qk_norm,post_norms,fused_qkv,fused_gate_up,"
    "geglu,embedding_scale,attention_scale,final_logit_softcap,moe,moe_shared_expert,yarn_rope,"
    "attn_output_bias,attention_sinks,moe_topk_softmax,moe_biases,swiglu_oai";

// Refuses (UnsupportedModel, naming them) an architecture or features not in
// the lists above; read_model_config has already refused what no backend of
// this repository computes.
void check_supported(const touchstone::ModelConfig& c, const std::string& path) {
  const std::string missing = touchstone::unsupported_features(c, kArchitectures, kModelFeatures);
  if (!missing.empty())
    throw touchstone::UnsupportedModel("{}: not supported by vulkan: {}", path, missing);
}

struct Vulkan {
  static constexpr const char* name = "vulkan";
  static constexpr const char* version = "0.1.0";
  static constexpr const char* architectures = kArchitectures;
  static constexpr const char* model_features = kModelFeatures;

  struct Model {
    Model(std::shared_ptr<touchstone::vk::Context> c, touchstone::gguf::File f,
          touchstone::ModelConfig cfg)
        : ctx(std::move(c)), file(std::move(f)), config(cfg) {
      kernels = std::make_unique<touchstone::vk::Kernels>(*ctx);
    }
    std::shared_ptr<touchstone::vk::Context> ctx;
    std::unique_ptr<touchstone::vk::Kernels> kernels;
    touchstone::gguf::File file;
    touchstone::ModelConfig config;
    std::mutex upload_mutex;
    std::array<std::unique_ptr<touchstone::vk::DeviceWeights>, 2> weights;  // [ts_weight_path]
    // step_batch's shared activations, per weight path (made with the weights).
    std::array<std::unique_ptr<touchstone::vk::BatchWorkspace>, 2> batch;
    int32_t n_vocab() const { return config.n_vocab; }
  };

  // position, max_context, prefill, rewind and the ABI v4 layer taps forward
  // to vk::Forward (vk_forward.h).
  struct Session : touchstone::abi::EngineSession<touchstone::vk::Forward> {
    touchstone::vk::BatchWorkspace* batch = nullptr;  // the model's, for this weight path
    // The argmax runs in a shader (argmax.comp); only the 4-byte token id comes
    // back, not the n_vocab logits.
    int32_t prefill_greedy(std::span<const int32_t> t) {
      return s->prefill_greedy(t.data(), int32_t(t.size()));
    }
    // ABI v8: input embeddings (Forward::prefill_embeddings).
    int32_t n_embd() const { return s->n_embd(); }
    void prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all,
                            float* logits) {
      s->prefill_embeddings(e, n, bidirectional, all, logits);
    }
    // ABI v6: the KV prefix copied on the device (vk_batch.cpp).
    std::unique_ptr<Session> fork(int32_t n_prefix) {
      auto f = std::make_unique<Session>();
      f->s = s->fork(n_prefix);
      f->batch = batch;
      return f;
    }
  };

  // ABI v6: one pass of up to Forward::kChunk rows over every entry's tokens
  // (vk_batch.cpp); the adapter has checked the entries (one model and weight path).
  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    std::vector<touchstone::vk::BatchEntry> e;
    for (const auto& it : items) {
      e.push_back({it.session->s.get(), it.tokens.data(), int32_t(it.tokens.size()),
                   it.all_positions, it.logits});
    }
    touchstone::vk::Forward::step_batch(*items[0].session->batch, e);
  }

  static std::string device_name() { return touchstone::vk::probe_device_description(); }

  static void capabilities(ts_capabilities& c) {
    // Batch invariance (both paths): every kernel reduces a row in an order
    // fixed by that row's own sizes (a matmul output: its row of W, one quad at
    // a time, the same for any token count or tile; attention: its own KV
    // length), so a token's bits do not depend on the other rows of a pass
    // (docs/backends/vulkan.md#serving; the serving checks hold it to bitwise).
    // Bitwise determinism: fixed reduction orders, no atomics, and the
    // session's thread count reaches no kernel (only the
    // thread_order_reduction fault reads it); lavapipe's own thread count
    // (LP_NUM_THREADS) only schedules whole workgroups.
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY |
              TS_CAP_BATCH_INVARIANT | TS_CAP_BITWISE_DETERMINISM;
    c.batch_invariant_paths = 0;  // every weight path
    // Read in place by the shaders on the quantized path: F32, Q4_0, Q4_1, Q8_0,
    // Q5_0, Q4_K, Q5_K, Q6_K; F16, BF16 and MXFP4 (gpt-oss's experts) are dequantized to
    // fp32 at load.
    c.weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                     TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(6) | TS_WEIGHT_TYPE_BIT(8) |
                     TS_WEIGHT_TYPE_BIT(12) | TS_WEIGHT_TYPE_BIT(13) | TS_WEIGHT_TYPE_BIT(14) |
                     TS_WEIGHT_TYPE_BIT(30) | TS_WEIGHT_TYPE_BIT(39);
    c.max_context = 0;
    c.determinism_note =
        "bitwise reproducible on one device and driver, any thread count (fixed reduction order, "
        "no atomics); the order depends on the device's subgroup size, so bits differ across "
        "devices";
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    auto ctx = touchstone::vk::Context::create();  // TS_ERR_DEVICE when there is no device
    touchstone::gguf::File file =
        touchstone::abi::load_or_status([&] { return touchstone::gguf::File::open(path); });
    const touchstone::ModelConfig config = touchstone::abi::load_or_status([&] {
      touchstone::ModelConfig c = touchstone::read_model_config(file);
      check_supported(c, path);
      return c;
    });
    return std::make_unique<Model>(std::move(ctx), std::move(file), config);
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    // The mixture-of-experts routing faults are injected by the host router (vk_moe.cpp).
    const touchstone::Faults faults =
        touchstone::abi::session_fault(o.fault, {.moe = true, .image_attention = true});
    if (!faults.name.empty() && !implements_fault(faults.name)) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "vulkan does not implement fault '" + faults.name + "'");
    }
    const size_t path = o.weight_path == TS_WEIGHTS_QUANTIZED ? 1 : 0;
    {
      std::lock_guard<std::mutex> lock(m.upload_mutex);
      if (!m.weights[path]) {
        m.weights[path] = touchstone::vk::upload_weights(*m.ctx, m.file, m.config, path == 1);
        m.batch[path] = std::make_unique<touchstone::vk::BatchWorkspace>(*m.ctx, m.config);
      }
    }
    // The quantized-only faults change nothing on full_precision (fp32 matrices).
    if (faults.quantized_only() && path == 1 && !quant_fault_applies(*m.weights[path], faults)) {
      throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + faults.name +
                                                "': this model has no Q4_0/Q4_1 matrix it "
                                                "applies to");
    }
    auto s = std::make_unique<Session>();
    s->s = std::make_unique<touchstone::vk::Forward>(*m.ctx, *m.kernels, *m.weights[path],
                                                     o.max_context, faults, o.n_threads);
    s->batch = m.batch[path].get();
    return s;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Vulkan)
