// cpu_simd_backend.cpp - the cpu_simd backend behind the session contract
// (touchstone/backend_abi.h). Built as libtouchstone_backend_cpu_simd.so.
#include "cpu_simd_backend.h"

#include <cblas.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "engine.h"
#include "touchstone/backend_impl.h"
#include "touchstone/error.h"
#include "touchstone/quant.h"

struct ts_model {
  std::unique_ptr<ts_cpu::Model> model;
};

struct ts_session {
  std::unique_ptr<ts_cpu::Session> s;
  int32_t n_vocab = 0;
};

namespace {

using touchstone::abi::StatusError;

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown CPU";
}

// TOUCHSTONE_CPU_SIMD_TARGET (kernels.h: select_isa_from_env): a target this
// build lacks or this CPU cannot run refuses the model and the session.
void require_isa() {
  const ts_cpu::IsaSelection& sel = ts_cpu::select_isa_from_env();
  if (sel.status != ts_cpu::IsaSelection::Ok) throw StatusError(TS_ERR_UNSUPPORTED, sel.message);
}

const char* device_name() {
  thread_local std::string name;
  const char* act = std::getenv("TOUCHSTONE_CPU_SIMD_ACTIVATIONS");
  const bool int8 = act && std::string(act) == "int8";
  const ts_cpu::IsaSelection& isa = ts_cpu::select_isa_from_env();
  const std::string target = isa.status != ts_cpu::IsaSelection::Ok ? "none, " + isa.message
                             : isa.forced.empty()                   ? ts_cpu::hwy_current_target()
                                                                    : ts_cpu::hwy_current_target() +
                                                        " (forced by TOUCHSTONE_CPU_SIMD_TARGET)";
  name =
      "CPU: " + cpu_model() + " (" + std::to_string(std::thread::hardware_concurrency()) +
      " hardware threads; fp32 kernels: Highway " + target +
      (int8 ? std::string("; quantized path: int8 activations, ") +
                  ts_cpu::qlevel_name(ts_cpu::qlevel())
            : std::string("; quantized path: fp32 activations, blocks dequantized in registers")) +
      "; prefill sgemm: OpenBLAS)";
  return name.c_str();
}

ts_status capabilities(ts_capabilities* out) {
  return touchstone::abi::guard([&] {
    if (!out || out->struct_size < sizeof(ts_capabilities)) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "capabilities: struct_size too small");
    }
    *out = ts_capabilities{};
    out->struct_size = sizeof(ts_capabilities);
    // Bitwise determinism across runs and thread counts holds for both paths:
    // work is split by output rows / (token, head) pairs in fixed-size chunks,
    // never inside one reduction (tested in cpu_simd_test).
    out->flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM | TS_CAP_DEVICE_GREEDY;
    // Both paths: every type the reference dequantizer knows. quantized:
    // dedicated kernels for Q4_0/Q4_1/Q8_0, the generic block kernel (dequantize
    // one block in the kernel) for the others (Q4_K, Q6_K, Q5_x, F16, ...).
    out->weight_types = 0;
    for (int t = 0; t < 64; ++t) {
      if (touchstone::gguf::can_dequantize(touchstone::gguf::TensorType(t)))
        out->weight_types |= TS_WEIGHT_TYPE_BIT(t);
    }
    out->max_context = 0;
    out->determinism_note = nullptr;
  });
}

ts_status load_model(const char* path, ts_model** out) {
  return touchstone::abi::guard([&] {
    if (!path || !out) throw StatusError(TS_ERR_INVALID_ARGUMENT, "load_model: null argument");
    *out = nullptr;
    require_isa();
    auto m = std::make_unique<ts_model>();
    try {
      m->model = std::make_unique<ts_cpu::Model>(path);
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

int32_t n_vocab(const ts_model* m) { return m ? m->model->config().n_vocab : 0; }

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
    if (opt->n_threads < 0 || opt->max_context < 0) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "open_session: negative n_threads or max_context");
    }
    require_isa();
    ts_cpu::SessionOptions so;
    so.quantized = opt->weight_path == TS_WEIGHTS_QUANTIZED;
    if (const char* act = std::getenv("TOUCHSTONE_CPU_SIMD_ACTIVATIONS")) {
      const std::string a = act;
      if (a == "int8") {
        so.int8_activations = true;
      } else if (a != "fp32" && !a.empty()) {
        throw StatusError(TS_ERR_INVALID_ARGUMENT,
                          "TOUCHSTONE_CPU_SIMD_ACTIVATIONS must be fp32 or int8, not '" + a + "'");
      }
    }
    so.n_threads = opt->n_threads;
    so.max_context = opt->max_context;
    try {
      so.faults = touchstone::parse_fault(opt->fault ? opt->fault : "");
    } catch (const touchstone::Error& e) {
      throw StatusError(TS_ERR_UNSUPPORTED, e.what());
    }
    // OpenBLAS runs single-threaded inside our own pool's tasks.
    openblas_set_num_threads(1);
    auto s = std::make_unique<ts_session>();
    s->s = std::make_unique<ts_cpu::Session>(*m->model, so);
    s->n_vocab = m->model->config().n_vocab;
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
    touchstone::abi::check_tokens(tokens, n, s->n_vocab);
    touchstone::abi::check_room(s->s->position(), n, s->s->max_context());
    s->s->forward(tokens, n, all_positions != 0, logits);
  });
}

ts_status decode(ts_session* s, int32_t token, float* logits) {
  return touchstone::abi::guard([&] {
    if (!s || !logits) throw StatusError(TS_ERR_INVALID_ARGUMENT, "decode: null argument");
    touchstone::abi::check_tokens(&token, 1, s->n_vocab);
    touchstone::abi::check_room(s->s->position(), 1, s->s->max_context());
    s->s->forward(&token, 1, false, logits);
  });
}

ts_status rewind(ts_session* s, int32_t position) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "rewind: null session");
    touchstone::abi::check_rewind(position, s->s->position());
    s->s->rewind(position);
  });
}

int32_t position(const ts_session* s) { return s ? s->s->position() : 0; }

ts_status set_taps(ts_session* s, int32_t enable) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "set_taps: null session");
    s->s->set_taps(enable != 0);
  });
}

ts_status read_taps(ts_session* s, float* out, int64_t n) {
  return touchstone::abi::guard([&] {
    if (!s) throw StatusError(TS_ERR_INVALID_ARGUMENT, "read_taps: null session");
    const std::vector<float>& t = s->s->taps();
    touchstone::abi::copy_taps(t.data(), t.size(), out, n);
  });
}

// The "device" is the CPU: the logits land in the session's own buffer and only
// the token id is returned.
ts_status prefill_greedy(ts_session* s, const int32_t* tokens, int32_t n, int32_t* token_out) {
  return touchstone::abi::guard([&] {
    if (!s || !tokens || !token_out || n <= 0) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "prefill_greedy: null buffer or n_tokens <= 0");
    }
    touchstone::abi::check_tokens(tokens, n, s->n_vocab);
    touchstone::abi::check_room(s->s->position(), n, s->s->max_context());
    float* logits = s->s->greedy_logits();
    s->s->forward(tokens, n, false, logits);
    *token_out = touchstone::abi::greedy_argmax(logits, s->n_vocab);
  });
}

const ts_backend kBackend = {
    TS_BACKEND_API_VERSION,
    "cpu_simd",
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
    // ABI v3: the families and features the engine computes (engine.h;
    // docs/model-families.md).
    ts_cpu::kArchitectures,
    ts_cpu::kModelFeatures,
    set_taps,  // ABI v4: layer taps
    read_taps,
};

}  // namespace

namespace ts_cpu {
const ts_backend* backend_table() { return &kBackend; }
}  // namespace ts_cpu
