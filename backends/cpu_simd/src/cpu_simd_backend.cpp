// cpu_simd_backend.cpp - the cpu_simd backend behind the session contract
// (touchstone/abi/backend_abi.h) through touchstone::BackendAdapter, which applies
// the shared argument checks. Built as libtouchstone_backend_cpu_simd.so.
#include "cpu_simd_backend.h"

#include <cblas.h>

#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/session_fault.h"
#include "vision.h"

namespace touchstone::cpu_simd {
namespace {

using touchstone::abi::StatusError;

// TOUCHSTONE_CPU_SIMD_TARGET (kernels.h: select_isa_from_env): a target this
// build lacks or this CPU cannot run refuses the model and the session.
void require_isa() {
  const IsaSelection& sel = select_isa_from_env();
  if (sel.status != IsaSelection::Ok) throw StatusError(TS_ERR_UNSUPPORTED, sel.message);
}

bool int8_activations() {
  const char* act = std::getenv("TOUCHSTONE_CPU_SIMD_ACTIVATIONS");
  const std::string a = act ? act : "";
  if (a != "int8" && a != "fp32" && !a.empty()) {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "TOUCHSTONE_CPU_SIMD_ACTIVATIONS must be fp32 or int8, not '" + a + "'");
  }
  return a == "int8";
}

struct CpuSimd {
  static constexpr const char* name = "cpu_simd";
  static constexpr const char* version = "0.1.0";
  // ABI v3: the families and features the engine computes (engine.h;
  // docs/model-families.md).
  static constexpr const char* architectures = kArchitectures;
  static constexpr const char* model_features = kModelFeatures;

  struct Model {
    std::unique_ptr<touchstone::cpu_simd::SimdModel> m;
    std::unique_ptr<SimdVision> vision;  // ABI v8 load_vision
    int32_t n_vocab() const { return m->config().n_vocab; }

    // ABI v8: cpu_simd's own vision tower (vision.h), checked against the text model.
    void load_vision(const std::string& path) {
      auto v = touchstone::abi::load_or_status([&] { return std::make_unique<SimdVision>(path); });
      if (v->config().n_embd_text != m->config().n_embd) {
        throw StatusError(
            TS_ERR_INVALID_ARGUMENT,
            path + ": clip.vision.projection_dim = " + std::to_string(v->config().n_embd_text) +
                " is not the model's embedding width " + std::to_string(m->config().n_embd));
      }
      vision = std::move(v);
    }
    void encode_image(const ts_image& img, float* out, int64_t n_floats) {
      if (!vision) throw StatusError(TS_ERR_INVALID_ARGUMENT, "encode_image: load_vision first");
      const auto& c = vision->config();
      vision->encode(
          touchstone::abi::tower_pixels(img, c.image_size, c.n_tokens(), c.n_embd_text, n_floats),
          out);
    }
    // ABI v9: the project's processor (vision.h), with the image_resample_filter fault.
    ts_pixel_shape preprocess_image(const ts_image& img, float* out, int64_t n_floats) {
      if (!vision)
        throw StatusError(TS_ERR_INVALID_ARGUMENT, "preprocess_image: load_vision first");
      const touchstone::vision::Image rgb = touchstone::vision::rgb8_image(
          static_cast<const uint8_t*>(img.data), img.height, img.width);
      return touchstone::abi::pixel_frames(vision->preprocess(rgb).frames, out, n_floats);
    }
    // ABI v9: image_resample_filter and projector_grid_transposed; no other fault.
    void set_vision_fault(const std::string& name) {
      if (!vision)
        throw StatusError(TS_ERR_INVALID_ARGUMENT, "set_vision_options: load_vision first");
      vision->set_faults(touchstone::abi::vision_fault(name));
    }
  };

  // position, max_context, prefill, rewind and the layer taps forward to
  // cpu_simd::SimdSession (engine.h).
  struct Session : touchstone::abi::EngineSession<touchstone::cpu_simd::SimdSession> {
    int32_t n_vocab = 0;
    // The "device" is the CPU: the logits land in the session's own buffer and
    // only the token id is returned.
    int32_t prefill_greedy(std::span<const int32_t> t) {
      float* logits = s->greedy_logits();
      s->prefill(t.data(), int32_t(t.size()), false, logits);
      return touchstone::abi::greedy_argmax(logits, n_vocab);
    }
    // ABI v8: input embeddings (SimdSession::prefill_embeddings).
    int32_t n_embd() const { return s->n_embd(); }
    void prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all,
                            float* logits) {
      s->prefill_embeddings(e, n, bidirectional, all, logits);
    }
    // ABI v6: a session with src's options and its first n_prefix KV entries.
    std::unique_ptr<Session> fork(int32_t n_prefix) {
      auto f = std::make_unique<Session>();
      f->s = s->fork(n_prefix);
      f->n_vocab = n_vocab;
      return f;
    }
  };

  // ABI v6: every entry in passes of up to 128 tokens, each weight matrix read
  // once per pass (engine.h: SimdSession::step_batch).
  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    std::vector<BatchEntry> entries;
    entries.reserve(items.size());
    for (const auto& it : items) {
      entries.push_back({it.session->s.get(), it.tokens.data(), int32_t(it.tokens.size()),
                         it.all_positions, it.logits});
    }
    touchstone::cpu_simd::SimdSession::step_batch(entries);
  }

  static std::string device_name() {
    const IsaSelection& isa = select_isa_from_env();
    const std::string target =
        isa.status != IsaSelection::Ok ? "none, " + isa.message
        : isa.forced.empty()           ? hwy_current_target()
                             : hwy_current_target() + " (forced by TOUCHSTONE_CPU_SIMD_TARGET)";
    const char* act = std::getenv("TOUCHSTONE_CPU_SIMD_ACTIVATIONS");
    const bool int8 = act && std::string(act) == "int8";
    return touchstone::abi::cpu_device_name() + "; fp32 kernels: Highway " + target +
           (int8 ? std::string("; quantized path: int8 activations, ") + qlevel_name(qlevel()) +
                       (qlevel() == QLevel::AVX512VNNI
                            ? " (Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K rows interleaved by 16)"
                            : "")
                 : std::string("; quantized path: fp32 activations, blocks dequantized in "
                               "registers")) +
           "; prefill sgemm: OpenBLAS)";
  }

  static void capabilities(ts_capabilities& c) {
    // Bitwise determinism across runs and thread counts holds for both paths:
    // work is split by output rows / (token, head) pairs in fixed-size chunks,
    // never inside one reduction (tested in cpu_simd_test). TS_CAP_DEVICE_GREEDY
    // is set by the adapter (prefill_greedy).
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM | TS_CAP_BATCHED_SESSIONS;
    // Batch invariance (ABI v6): the quantized path's kernels give every
    // output the same operation sequence for any token count (register tiles
    // for decode, fp32 panels for prefill; F32 matrices through the matvec),
    // in fp32 and int8 activation mode, on every Highway target; attention,
    // norms and RoPE are per token. Full precision is not covered: OpenBLAS
    // sgemm (several tokens) and the Highway matvec (one) sum in different
    // orders. Tested: BatchTest.* in cpu_simd_test (docs/backends/cpu_simd.md).
    c.flags |= TS_CAP_BATCH_INVARIANT;
    c.batch_invariant_paths = kBatchInvariantPaths;
    c.max_batch = 0;  // any number of entries (passes of up to 128 tokens)
    // Both paths: every type the reference dequantizer knows. quantized:
    // dedicated kernels for Q4_0/Q4_1/Q8_0, the generic block kernel (dequantize
    // one block in the kernel) for the others (Q4_K, Q6_K, Q5_x, F16, ...).
    for (int t = 0; t < 64; ++t) {
      if (touchstone::gguf::can_dequantize(touchstone::gguf::TensorType(t)))
        c.weight_types |= TS_WEIGHT_TYPE_BIT(t);
    }
    c.max_context = 0;
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    require_isa();
    auto m = std::make_unique<Model>();
    m->m = touchstone::abi::load_or_status(
        [&] { return std::make_unique<touchstone::cpu_simd::SimdModel>(path); });
    return m;
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    require_isa();
    SimdSessionOptions so;
    so.quantized = o.weight_path == TS_WEIGHTS_QUANTIZED;
    so.int8_activations = int8_activations();
    so.n_threads = o.n_threads;
    so.max_context = o.max_context;
    so.faults = touchstone::abi::session_fault(
        o.fault,
        {.sinks = true, .image_attention = true, .image_position = true, .image_split = true});
    // OpenBLAS runs single-threaded inside our own pool's tasks.
    openblas_set_num_threads(1);
    auto s = std::make_unique<Session>();
    s->s = std::make_unique<touchstone::cpu_simd::SimdSession>(*m.m, so);
    s->n_vocab = m.n_vocab();
    return s;
  }
};

}  // namespace

const ts_backend* backend_table() { return touchstone::BackendAdapter<CpuSimd>::table(); }

}  // namespace touchstone::cpu_simd
