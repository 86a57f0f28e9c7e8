// static_graph_backend.cpp - the static_graph backend behind the session
// contract (touchstone/backend_abi.h): whole-model graphs built from the GGUF
// model, compiled by MLIR (TOSA -> LLVM) and run with mlir::ExecutionEngine.
#include <filesystem>
#include <memory>
#include <string>

#include "engine.h"
#include "touchstone/backend_abi.h"
#include "touchstone/backend_impl.h"
#include "touchstone/error.h"
#include "touchstone/llama_config.h"

namespace sg = touchstone::static_graph;

struct ts_model {
  std::unique_ptr<sg::Model> m;
};

struct ts_session {
  std::unique_ptr<sg::Session> s;
};

namespace {

using touchstone::abi::StatusError;

// Default KV capacity when the caller passes max_context = 0 (the attention
// window of the largest graph; the model's own context is 8192 for SmolLM2).
constexpr int32_t kDefaultCapacity = 2048;

const char* device_name() {
  thread_local std::string name;
  const std::string& omp = sg::openmp_runtime();
  name = "CPU (" + sg::host_cpu_name() + "), MLIR 22 TOSA->LLVM JIT, " +
         (omp.empty() ? std::string("one thread (OpenMP runtime not found)")
                      : "matmuls on n_threads threads (OpenMP, " +
                            std::filesystem::path(omp).filename().string() + ")");
  return name.c_str();
}

ts_status capabilities(ts_capabilities* out) {
  return touchstone::abi::guard([&] {
    if (!out || out->struct_size < sizeof(ts_capabilities)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "capabilities: struct_size too small");
    }
    *out = ts_capabilities{};
    out->struct_size = sizeof(ts_capabilities);
    out->flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_DEVICE_GREEDY | TS_CAP_STATIC_SHAPES |
                 TS_CAP_BITWISE_DETERMINISM;
    out->weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(2) | TS_WEIGHT_TYPE_BIT(3) |
                        TS_WEIGHT_TYPE_BIT(8);
    out->max_context = 0;  // limited by the model; a session opened with 0 gets kDefaultCapacity
    const sg::BucketConfig b;
    out->n_shape_buckets = 0;
    out->shape_buckets[out->n_shape_buckets++] = 1;
    for (int32_t t : b.prefill) out->shape_buckets[out->n_shape_buckets++] = t;
    out->determinism_note = nullptr;
  });
}

ts_status load_model(const char* path, ts_model** out) {
  return touchstone::abi::guard([&] {
    if (!path || !out) throw StatusError(TS_ERR_INVALID_ARGUMENT, "load_model: null argument");
    *out = nullptr;
    auto m = std::make_unique<ts_model>();
    try {
      m->m = sg::load_model(path);
    } catch (const StatusError&) {
      throw;
    } catch (const touchstone::UnsupportedModel& e) {  // another family, or a feature it lacks
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_IO, e.what());
    }
    *out = m.release();
  });
}

void free_model(ts_model* m) { delete m; }

int32_t n_vocab(const ts_model* m) { return m ? m->m->dims.n_vocab : 0; }

ts_status open_session(ts_model* m, const ts_session_options* opt, ts_session** out) {
  return touchstone::abi::guard([&] {
    if (!m || !opt || !out)
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: null argument");
    if (opt->struct_size < sizeof(ts_session_options)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: struct_size too small");
    }
    // Test only: one deliberate bug of the catalog (docs/backends/static_graph.md#fault-catalog).
    touchstone::Faults faults;
    try {
      faults = touchstone::parse_fault(opt->fault ? opt->fault : "");
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    }
    if (opt->max_context < 0)
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: max_context < 0");
    int32_t cap = opt->max_context > 0 ? opt->max_context : kDefaultCapacity;
    if (m->m->n_ctx_train > 0 && cap > m->m->n_ctx_train) cap = m->m->n_ctx_train;
    const sg::WeightMode mode = opt->weight_path == TS_WEIGHTS_QUANTIZED
                                    ? sg::WeightMode::Quantized
                                    : sg::WeightMode::FullPrecision;
    auto s = std::make_unique<ts_session>();
    s->s = std::make_unique<sg::Session>(*m->m, mode, cap, opt->n_threads, faults);
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
    touchstone::abi::check_tokens(tokens, n, s->s->n_vocab());
    touchstone::abi::check_room(s->s->position(), n, s->s->capacity());
    s->s->prefill(tokens, n, all_positions != 0, logits);
  });
}

ts_status decode(ts_session* s, int32_t token, float* logits) {
  return touchstone::abi::guard([&] {
    if (!s || !logits) throw StatusError(TS_ERR_INVALID_ARGUMENT, "decode: null argument");
    touchstone::abi::check_tokens(&token, 1, s->s->n_vocab());
    touchstone::abi::check_room(s->s->position(), 1, s->s->capacity());
    s->s->decode(token, logits);
  });
}

ts_status rewind(ts_session* s, int32_t position) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "rewind: null session");
    touchstone::abi::check_rewind(position, s->s->position());
    s->s->rewind(position);
  });
}

ts_status prefill_greedy(ts_session* s, const int32_t* tokens, int32_t n, int32_t* token_out) {
  return touchstone::abi::guard([&] {
    if (!s || !tokens || !token_out || n <= 0) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "prefill_greedy: null buffer or n_tokens <= 0");
    }
    touchstone::abi::check_tokens(tokens, n, s->s->n_vocab());
    touchstone::abi::check_room(s->s->position(), n, s->s->capacity());
    *token_out = s->s->prefill_greedy(tokens, n);
  });
}

int32_t position(const ts_session* s) { return s ? s->s->position() : 0; }

const ts_backend kBackend = {
    TS_BACKEND_API_VERSION,
    "static_graph",
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
