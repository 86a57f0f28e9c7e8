// reference_backend.cpp - the scalar reference transformer behind the session
// contract (touchstone/backend_abi.h). Built as libtouchstone_backend_reference.so.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "touchstone/backend_abi.h"
#include "touchstone/backend_impl.h"
#include "touchstone/gguf.h"
#include "touchstone/llama_weights.h"
#include "touchstone/reference_forward.h"

struct ts_model {
  touchstone::LlamaWeights weights;
};

struct ts_session {
  std::unique_ptr<touchstone::ReferenceTransformer> ref;
  bool causal_mask_fault = false;
  bool row_shift_fault = false;       // logits_row_shift
  bool position_reset_fault = false;  // prefill_position_reset
};

namespace {

using touchstone::abi::StatusError;

const char* device_name() {
  thread_local std::string name;
  name = "CPU (scalar reference, fp64 accumulation, " +
         std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
  return name.c_str();
}

ts_status capabilities(ts_capabilities* out) {
  return touchstone::abi::guard([&] {
    if (!out || out->struct_size < sizeof(ts_capabilities)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "capabilities: struct_size too small");
    }
    *out = ts_capabilities{};
    out->struct_size = sizeof(ts_capabilities);
    out->flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM;
    // Everything the dequantizer understands; all are converted to fp32 at load.
    out->weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                        TS_WEIGHT_TYPE_BIT(6) | TS_WEIGHT_TYPE_BIT(7) | TS_WEIGHT_TYPE_BIT(10) |
                        TS_WEIGHT_TYPE_BIT(11) | TS_WEIGHT_TYPE_BIT(13) | TS_WEIGHT_TYPE_BIT(15) |
                        TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(8) | TS_WEIGHT_TYPE_BIT(12) |
                        TS_WEIGHT_TYPE_BIT(14) | TS_WEIGHT_TYPE_BIT(30);
    out->max_context = 0;
    out->determinism_note = nullptr;
  });
}

ts_status load_model(const char* path, ts_model** out) {
  return touchstone::abi::guard([&] {
    if (!path || !out) throw StatusError(TS_ERR_INVALID_ARGUMENT, "load_model: null argument");
    *out = nullptr;
    std::unique_ptr<ts_model> m;
    try {
      const touchstone::gguf::File file = touchstone::gguf::File::open(path);
      m = std::make_unique<ts_model>(ts_model{touchstone::load_model_weights(file)});
    } catch (const touchstone::UnsupportedModel& e) {
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_IO, e.what());
    }
    *out = m.release();
  });
}

void free_model(ts_model* m) { delete m; }

int32_t n_vocab(const ts_model* m) { return m ? m->weights.config.n_vocab : 0; }

ts_status open_session(ts_model* m, const ts_session_options* opt, ts_session** out) {
  return touchstone::abi::guard([&] {
    if (!m || !opt || !out)
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: null argument");
    if (opt->struct_size < sizeof(ts_session_options)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: struct_size too small");
    }
    if (opt->weight_path != TS_WEIGHTS_FULL_PRECISION) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "the reference backend computes only with fp32 weights (full_precision)");
    }
    touchstone::Faults faults;
    try {
      faults = touchstone::parse_fault(opt->fault ? opt->fault : "");
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    }
    if (faults.quantized_only()) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "fault '" + faults.name +
                            "' corrupts quantized weight blocks; the reference has no quantized "
                            "path (it dequantizes every tensor with the reference dequantizer)");
    }
    const int threads = opt->n_threads > 0 ? opt->n_threads
                                           : int(std::max(1u, std::thread::hardware_concurrency()));
    auto s = std::make_unique<ts_session>();
    s->causal_mask_fault = faults.causal_mask;
    s->row_shift_fault = faults.logits_row_shift;
    s->position_reset_fault = faults.prefill_position_reset;
    s->ref = std::make_unique<touchstone::ReferenceTransformer>(m->weights, opt->max_context,
                                                                threads, faults);
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
    touchstone::abi::check_tokens(tokens, n, s->ref->n_vocab());
    touchstone::abi::check_room(s->ref->position(), n, s->ref->max_context());
    const size_t v = size_t(s->ref->n_vocab());
    if (s->causal_mask_fault && n > 1) {
      // The causal_mask fault: one token at a time, the reference has no chunk to
      // mask. A first, causal pass fills the chunk's KV entries; the second pass
      // then lets every position also attend to the chunk's later entries.
      const int32_t p0 = s->ref->position();
      std::vector<float> scratch(v);
      for (int32_t i = 0; i < n; ++i) s->ref->forward(tokens[i], scratch);
      s->ref->rewind(p0);
      s->ref->set_chunk_end(p0 + n);
    }
    // prefill_position_reset fault: a prefill continuing a sequence rotates its
    // tokens as positions 0, 1, ... (their K/V still go to the right slots).
    if (s->position_reset_fault && n > 1) s->ref->set_rope_origin(s->ref->position());
    for (int32_t i = 0; i < n; ++i) {
      float* row = all_positions ? logits + size_t(i) * v : logits;
      s->ref->forward(tokens[i], std::span<float>(row, v));
    }
    s->ref->set_chunk_end(0);
    s->ref->set_rope_origin(0);
    if (s->row_shift_fault && all_positions && n > 1)  // the fault: row i holds row i-1
      std::memmove(logits + v, logits, size_t(n - 1) * v * sizeof(float));
  });
}

ts_status decode(ts_session* s, int32_t token, float* logits) {
  return touchstone::abi::guard([&] {
    if (!s || !logits) throw StatusError(TS_ERR_INVALID_ARGUMENT, "decode: null argument");
    touchstone::abi::check_tokens(&token, 1, s->ref->n_vocab());
    touchstone::abi::check_room(s->ref->position(), 1, s->ref->max_context());
    s->ref->forward(token, std::span<float>(logits, size_t(s->ref->n_vocab())));
  });
}

ts_status rewind(ts_session* s, int32_t position) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "rewind: null session");
    touchstone::abi::check_rewind(position, s->ref->position());
    s->ref->rewind(position);
  });
}

int32_t position(const ts_session* s) { return s ? s->ref->position() : 0; }

ts_status set_taps(ts_session* s, int32_t enable) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "set_taps: null session");
    s->ref->set_taps(enable != 0);
  });
}

ts_status read_taps(ts_session* s, float* out, int64_t n) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "read_taps: null session");
    const std::vector<float>& t = s->ref->taps();
    touchstone::abi::copy_taps(t.data(), t.size(), out, n);
  });
}

const ts_backend kBackend = {
    TS_BACKEND_API_VERSION,
    "reference",
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
    nullptr,                          // prefill_greedy: no TS_CAP_DEVICE_GREEDY,
    "llama,qwen2,qwen3,gemma3,phi3",  // ABI v3: every family and feature the reference reads
                                      // (docs/model-families.md)
    "*",
    set_taps,  // ABI v4: layer taps
    read_taps,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry(void) {
  return &kBackend;
}
