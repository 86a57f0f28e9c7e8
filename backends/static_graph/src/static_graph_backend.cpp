// static_graph_backend.cpp - the static_graph backend behind the session
// contract (touchstone/abi/backend_abi.h) through touchstone::BackendAdapter:
// whole-model graphs built from the GGUF model, compiled by MLIR (TOSA -> LLVM)
// and run with mlir::ExecutionEngine.
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "engine.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/session_fault.h"

namespace {

namespace sg = touchstone::static_graph;
using touchstone::abi::StatusError;

// Default KV capacity when the caller passes max_context = 0 (the attention
// window of the largest graph; the model's own context is 8192 for SmolLM2).
constexpr int32_t kDefaultCapacity = 2048;

struct StaticGraph {
  static constexpr const char* name = "static_graph";
  static constexpr const char* version = "0.1.0";
  // ABI v3: every family and feature of touchstone::ModelConfig (engine.h;
  // docs/model-families.md). ABI v4: layer taps (GraphSession::set_taps).
  static constexpr const char* architectures = sg::kArchitectures;
  static constexpr const char* model_features = sg::kModelFeatures;

  struct Model {
    std::unique_ptr<sg::GraphModel> m;
    int32_t n_vocab() const { return m->dims.n_vocab; }
  };

  // position, max_context, prefill, rewind and the layer taps forward to
  // sg::GraphSession (engine.h).
  struct Session : touchstone::abi::EngineSession<sg::GraphSession> {
    void decode(int32_t token, float* logits) { s->decode(token, logits); }
    int32_t prefill_greedy(std::span<const int32_t> t) {
      return s->prefill_greedy(t.data(), int32_t(t.size()));
    }
    // ABI v8: input embeddings (GraphSession::prefill_embeddings: an image block is
    // one graph call of exactly its rows).
    int32_t n_embd() const { return s->n_embd(); }
    void prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all,
                            float* logits) {
      s->prefill_embeddings(e, n, bidirectional, all, logits);
    }
  };

  static std::string device_name() {
    const std::string& omp = sg::openmp_runtime();
    return "CPU (" + sg::host_cpu_name() + "), MLIR 22 TOSA->LLVM JIT, " +
           (omp.empty() ? std::string("one thread (OpenMP runtime not found)")
                        : "matmuls on n_threads threads (OpenMP, " +
                              std::filesystem::path(omp).filename().string() + ")");
  }

  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_STATIC_SHAPES | TS_CAP_BITWISE_DETERMINISM;
    // F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (graph.h: MatrixFormat)
    c.weight_types = TS_WEIGHT_TYPE_BIT(0) | TS_WEIGHT_TYPE_BIT(1) | TS_WEIGHT_TYPE_BIT(2) |
                     TS_WEIGHT_TYPE_BIT(3) | TS_WEIGHT_TYPE_BIT(7) | TS_WEIGHT_TYPE_BIT(13) |
                     TS_WEIGHT_TYPE_BIT(6) | TS_WEIGHT_TYPE_BIT(8) | TS_WEIGHT_TYPE_BIT(12) |
                     TS_WEIGHT_TYPE_BIT(14);
    c.max_context = 0;  // limited by the model; a session opened with 0 gets kDefaultCapacity
    const sg::BucketConfig b;
    c.shape_buckets[c.n_shape_buckets++] = 1;
    for (int32_t t : b.prefill) c.shape_buckets[c.n_shape_buckets++] = t;
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    auto m = std::make_unique<Model>();
    m->m = touchstone::abi::load_or_status([&] { return sg::load_model(path); });
    return m;
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    // Test only: one deliberate bug of the catalog (docs/backends/static_graph.md#fault-catalog).
    // The mixture-of-experts and attention-sink faults are in the graph (graph.cpp
    // route(), moe_ffn(), attend()).
    const touchstone::Faults faults = touchstone::abi::session_fault(
        o.fault, {.moe = true, .sinks = true, .image_attention = true});
    if (faults.serving()) {
      throw StatusError(TS_ERR_UNSUPPORTED, "static_graph does not implement the serving fault '" +
                                                faults.name + "' (docs/serving-checks.md)");
    }
    int32_t cap = o.max_context > 0 ? o.max_context : kDefaultCapacity;
    if (m.m->n_ctx_train > 0 && cap > m.m->n_ctx_train) cap = m.m->n_ctx_train;
    const sg::WeightMode mode = o.weight_path == TS_WEIGHTS_QUANTIZED
                                    ? sg::WeightMode::Quantized
                                    : sg::WeightMode::FullPrecision;
    auto s = std::make_unique<Session>();
    s->s = std::make_unique<sg::GraphSession>(*m.m, mode, cap, o.n_threads, faults);
    return s;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(StaticGraph)
