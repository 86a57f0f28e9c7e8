// reference_backend.cpp - the scalar reference transformer behind the session
// contract (touchstone/backend_abi.h) through touchstone::BackendAdapter, which
// applies the shared argument checks. Built as libtouchstone_backend_reference.so.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "touchstone/backend_impl.h"
#include "touchstone/gguf.h"
#include "touchstone/llama_weights.h"
#include "touchstone/reference_forward.h"

namespace {

using touchstone::abi::StatusError;

struct Reference {
  static constexpr const char* name = "reference";
  static constexpr const char* version = "0.1.0";
  // ABI v3: every family and feature the reference reads (docs/model-families.md).
  static constexpr const char* architectures = "llama,qwen2,qwen3,gemma3,phi3";
  static constexpr const char* model_features = "*";

  struct Model {
    touchstone::LlamaWeights weights;
    int32_t n_vocab() const { return weights.config.n_vocab; }
  };

  struct Session {
    std::unique_ptr<touchstone::ReferenceTransformer> ref;
    bool causal_mask_fault = false;
    bool row_shift_fault = false;       // logits_row_shift
    bool position_reset_fault = false;  // prefill_position_reset

    int32_t position() const { return ref->position(); }
    int32_t max_context() const { return ref->max_context(); }
    void rewind(int32_t p) { ref->rewind(p); }
    void set_taps(bool on) { ref->set_taps(on); }
    void read_taps(float* out, int64_t n) {
      touchstone::abi::copy_taps(ref->taps().data(), ref->taps().size(), out, n);
    }
    void decode(int32_t token, float* logits) {
      ref->forward(token, std::span<float>(logits, size_t(ref->n_vocab())));
    }
    void prefill(std::span<const int32_t> tokens, bool all, float* logits);
  };

  static std::string device_name() {
    return "CPU (scalar reference, fp64 accumulation, " +
           std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
  }

  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM;
    // Everything the dequantizer understands; all are converted to fp32 at load.
    for (int t : {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 30})
      c.weight_types |= TS_WEIGHT_TYPE_BIT(t);
    c.max_context = 0;
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    return touchstone::abi::load_or_status([&] {
      const touchstone::gguf::File file = touchstone::gguf::File::open(path);
      return std::make_unique<Model>(Model{touchstone::load_model_weights(file)});
    });
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    if (o.weight_path != TS_WEIGHTS_FULL_PRECISION) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "the reference backend computes only with fp32 weights (full_precision)");
    }
    touchstone::Faults faults;
    try {
      faults = touchstone::parse_fault(o.fault ? o.fault : "");
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    }
    if (faults.quantized_only()) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "fault '" + faults.name +
                            "' corrupts quantized weight blocks; the reference has no quantized "
                            "path (it dequantizes every tensor with the reference dequantizer)");
    }
    const int threads =
        o.n_threads > 0 ? o.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    auto s = std::make_unique<Session>();
    s->causal_mask_fault = faults.causal_mask;
    s->row_shift_fault = faults.logits_row_shift;
    s->position_reset_fault = faults.prefill_position_reset;
    s->ref = std::make_unique<touchstone::ReferenceTransformer>(m.weights, o.max_context, threads,
                                                                faults);
    return s;
  }
};

void Reference::Session::prefill(std::span<const int32_t> tokens, bool all, float* logits) {
  const auto n = int32_t(tokens.size());
  const size_t v = size_t(ref->n_vocab());
  if (causal_mask_fault && n > 1) {
    // The causal_mask fault: one token at a time, the reference has no chunk to
    // mask. A first, causal pass fills the chunk's KV entries; the second pass
    // then lets every position also attend to the chunk's later entries.
    const int32_t p0 = ref->position();
    std::vector<float> scratch(v);
    for (int32_t i = 0; i < n; ++i) ref->forward(tokens[size_t(i)], scratch);
    ref->rewind(p0);
    ref->set_chunk_end(p0 + n);
  }
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (their K/V still go to the right slots).
  if (position_reset_fault && n > 1) ref->set_rope_origin(ref->position());
  for (int32_t i = 0; i < n; ++i) {
    float* row = all ? logits + size_t(i) * v : logits;
    ref->forward(tokens[size_t(i)], std::span<float>(row, v));
  }
  ref->set_chunk_end(0);
  ref->set_rope_origin(0);
  if (row_shift_fault && all && n > 1)  // the fault: row i holds row i-1
    std::memmove(logits + v, logits, size_t(n - 1) * v * sizeof(float));
}

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Reference)
