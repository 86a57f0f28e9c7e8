// vulkan_backend.cpp - the Vulkan backend behind the session contract
// (touchstone/backend_abi.h). Built as libtouchstone_backend_vulkan.so.
//
// load_model creates the Vulkan context (TS_ERR_DEVICE when there is no
// device) and the pipelines; weights are uploaded on the first session that
// asks for a weight path (full_precision: fp32, quantized: GGUF blocks) and
// shared by later sessions of that model.
#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "touchstone/backend_abi.h"
#include "touchstone/backend_impl.h"
#include "touchstone/gguf.h"
#include "touchstone/llama_config.h"
#include "touchstone/llama_forward.h"
#include "vk_context.h"
#include "vk_forward.h"
#include "vk_kernels.h"
#include "vk_weights.h"

struct ts_model {
  std::shared_ptr<touchstone::vk::Context> ctx;
  std::unique_ptr<touchstone::vk::Kernels> kernels;
  touchstone::gguf::File file;
  touchstone::LlamaConfig config;
  std::mutex upload_mutex;
  std::array<std::unique_ptr<touchstone::vk::DeviceWeights>, 2> weights;  // [ts_weight_path]
};

struct ts_session {
  ts_model* model = nullptr;
  std::unique_ptr<touchstone::vk::Forward> fwd;
};

namespace {

using touchstone::abi::StatusError;

const char* device_name() {
  static const std::string name = touchstone::vk::probe_device_description();
  return name.c_str();
}

// The faults of the catalog this backend implements (docs/backends/vulkan.md,
// "Fault catalog"), by name: one added to the catalog later is refused until
// it is implemented here, never silently ignored.
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
                                             "session_order_reduction"};
  for (const char* n : kImplemented)
    if (name == n) return true;
  return false;
}

// quant_scale_min_swap and nibble_order are bugs in the shaders' dequantization
// (shaders/quant.glsl): they reach the Q4_1 blocks (d and m) and the Q4_0/Q4_1
// quants read in place. A quantized session of a model with no such matrix
// refuses them (other types are dequantized on the host at load).
bool quant_fault_applies(const touchstone::vk::DeviceWeights& w, const touchstone::Faults& f) {
  using touchstone::gguf::TensorType;
  auto hit = [&](const touchstone::vk::DeviceMatrix& m) {
    return m.type == TensorType::Q4_1 || (f.nibble_order && m.type == TensorType::Q4_0);
  };
  if (hit(w.token_embd) || (w.output.n_out && hit(w.output))) return true;
  for (const touchstone::vk::DeviceLayer& L : w.layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down})
      if (hit(*m)) return true;
  }
  return false;
}

ts_status capabilities(ts_capabilities* out) {
  return touchstone::abi::guard([&] {
    if (!out || out->struct_size < sizeof(ts_capabilities)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "capabilities: struct_size too small");
    }
    *out = ts_capabilities{};
    out->struct_size = sizeof(ts_capabilities);
    out->flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_DEVICE_GREEDY;
    // F32/Q4_0/Q4_1/Q8_0 are read in place by the shaders; the other types are
    // dequantized to fp32 at load.
    out->weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                        TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(8) | TS_WEIGHT_TYPE_BIT(12) |
                        TS_WEIGHT_TYPE_BIT(14) | TS_WEIGHT_TYPE_BIT(30);
    out->max_context = 0;
    out->determinism_note =
        "bitwise reproducible run to run on one device and driver (fixed reduction order, no "
        "atomics), "
        "but reduction order depends on the device's subgroup size, so bits differ across devices";
  });
}

ts_status load_model(const char* path, ts_model** out) {
  return touchstone::abi::guard([&] {
    if (!path || !out) throw StatusError(TS_ERR_INVALID_ARGUMENT, "load_model: null argument");
    *out = nullptr;
    auto ctx = touchstone::vk::Context::create();  // TS_ERR_DEVICE when there is no device
    touchstone::gguf::File file = [&] {
      try {
        return touchstone::gguf::File::open(path);
      } catch (const StatusError&) {
        throw;
      } catch (const touchstone::Error& e) {
        throw StatusError(TS_ERR_IO, e.what());
      }
    }();
    touchstone::LlamaConfig config;
    try {
      config = touchstone::read_llama_config(file);
    } catch (const StatusError&) {
      throw;
    } catch (const touchstone::UnsupportedModel& e) {  // another family, or a feature it lacks
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_IO, e.what());
    }
    auto kernels = std::make_unique<touchstone::vk::Kernels>(*ctx);
    auto m = std::unique_ptr<ts_model>(
        new ts_model{std::move(ctx), std::move(kernels), std::move(file), config, {}, {}});
    *out = m.release();
  });
}

void free_model(ts_model* m) { delete m; }

int32_t n_vocab(const ts_model* m) { return m ? m->config.n_vocab : 0; }

ts_status open_session(ts_model* m, const ts_session_options* opt, ts_session** out) {
  return touchstone::abi::guard([&] {
    if (!m || !opt || !out)
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: null argument");
    *out = nullptr;
    if (opt->struct_size < sizeof(ts_session_options)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: struct_size too small");
    }
    if (opt->weight_path != TS_WEIGHTS_FULL_PRECISION && opt->weight_path != TS_WEIGHTS_QUANTIZED) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: unknown weight path");
    }
    if (opt->max_context < 0)
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: max_context < 0");
    touchstone::Faults faults;
    try {
      faults = touchstone::parse_fault(opt->fault ? opt->fault : "");
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    }
    if (!faults.name.empty() && !implements_fault(faults.name)) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "vulkan does not implement fault '" + faults.name + "'");
    }
    const size_t path = opt->weight_path == TS_WEIGHTS_QUANTIZED ? 1 : 0;
    {
      std::lock_guard<std::mutex> lock(m->upload_mutex);
      if (!m->weights[path]) {
        m->weights[path] = touchstone::vk::upload_weights(*m->ctx, m->file, m->config, path == 1);
      }
    }
    // The quantized-only faults change nothing on full_precision (fp32 matrices).
    if (faults.quantized_only() && path == 1 && !quant_fault_applies(*m->weights[path], faults)) {
      throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + faults.name +
                                                "': this model has no Q4_0/Q4_1 matrix it "
                                                "applies to");
    }
    auto s = std::make_unique<ts_session>();
    s->model = m;
    s->fwd = std::make_unique<touchstone::vk::Forward>(*m->ctx, *m->kernels, *m->weights[path],
                                                       opt->max_context, faults, opt->n_threads);
    *out = s.release();
  });
}

void free_session(ts_session* s) { delete s; }

ts_status prefill(ts_session* s, const int32_t* tokens, int32_t n, int32_t all_positions,
                  float* logits) {
  return touchstone::abi::guard([&] {
    if (!s || !tokens || !logits || n <= 0) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "prefill: null buffer or n_tokens <= 0");
    }
    touchstone::abi::check_tokens(tokens, n, s->fwd->n_vocab());
    s->fwd->run(tokens, n, all_positions != 0, logits);
  });
}

ts_status decode(ts_session* s, int32_t token, float* logits) {
  return touchstone::abi::guard([&] {
    if (!s || !logits) throw StatusError(TS_ERR_INVALID_ARGUMENT, "decode: null argument");
    touchstone::abi::check_tokens(&token, 1, s->fwd->n_vocab());
    s->fwd->run(&token, 1, false, logits);
  });
}

ts_status rewind(ts_session* s, int32_t position) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "rewind: null session");
    touchstone::abi::check_rewind(position, s->fwd->position());
    s->fwd->rewind(position);
  });
}

int32_t position(const ts_session* s) { return s ? s->fwd->position() : 0; }

// The argmax runs in a shader (argmax.comp); only the 4-byte token id comes
// back, not the n_vocab logits.
ts_status prefill_greedy(ts_session* s, const int32_t* tokens, int32_t n, int32_t* token_out) {
  return touchstone::abi::guard([&] {
    if (!s || !tokens || !token_out || n <= 0) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "prefill_greedy: null buffer or n_tokens <= 0");
    }
    *token_out = s->fwd->greedy(tokens, n);  // checks the token ids
  });
}

const ts_backend kBackend = {
    TS_BACKEND_API_VERSION,
    "vulkan",
    "0.1.0",
    touchstone::abi::last_error,
    device_name,
    capabilities,
    load_model,
    free_model,
    n_vocab,
    open_session,
    free_session,
    prefill,
    decode,
    rewind,
    position,
    prefill_greedy,
    "llama",  // ABI v3: the plain Llama family only (docs/model-families.md)
    "",
    nullptr,  // ABI v4: no layer taps (set_taps)
    nullptr,  // read_taps
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry(void) {
  return &kBackend;
}
