// reference_backend.cpp - the scalar reference transformer behind the session
// contract (touchstone/abi/backend_abi.h) through touchstone::BackendAdapter, which
// applies the shared argument checks. Built as libtouchstone_backend_reference.so.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "reference_grammar.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/session_fault.h"
#include "touchstone/reference/reference_forward.h"
#include "touchstone/vision/image_prompt.h"
#include "touchstone/vision/vision_tower.h"
#include "weight_residency.h"

namespace {

using touchstone::abi::StatusError;

struct Reference {
  static constexpr const char* name = "reference";
  static constexpr const char* version = "0.1.0";
  // ABI v3: every family and feature the reference reads (docs/model-families.md).
  static constexpr const char* architectures =
      "llama,qwen2,qwen3,gemma3,phi3,qwen3moe,gpt-oss,qwen2moe";
  static constexpr const char* model_features = "*";

  struct Model {
    touchstone::StoredWeights weights;
    std::unique_ptr<touchstone::reference_backend::GrammarVocabulary> grammar_vocab;
    std::unique_ptr<touchstone::vision::VisionTower> tower;  // ABI v8 load_vision
    int32_t n_vocab() const { return weights.config.n_vocab; }

    // ABI v8: the reference's vision tower and projector (touchstone/vision/vision_tower.h).
    void load_vision(const std::string& path) {
      auto t = touchstone::abi::load_or_status([&] {
        return std::make_unique<touchstone::vision::VisionTower>(
            touchstone::vision::load_vision_tower(path));
      });
      if (t->config.n_embd_text != weights.config.n_embd) {
        throw StatusError(
            TS_ERR_INVALID_ARGUMENT,
            path + ": clip.vision.projection_dim = " + std::to_string(t->config.n_embd_text) +
                " is not the model's embedding width " + std::to_string(weights.config.n_embd));
      }
      tower = std::move(t);
    }
    void encode_image(const ts_image& img, float* out, int64_t n_floats) {
      if (!tower) throw StatusError(TS_ERR_INVALID_ARGUMENT, "encode_image: load_vision first");
      const touchstone::vision::VisionTowerConfig& c = tower->config;
      const float* px =
          touchstone::abi::tower_pixels(img, c.image_size, c.n_tokens(), c.n_embd_text, n_floats);
      const size_t n = size_t(3) * size_t(img.height) * size_t(img.width);
      touchstone::vision::PixelValues pv{3, img.height, img.width, std::vector<float>(px, px + n)};
      const std::vector<float> e =
          touchstone::vision::project(*tower, touchstone::vision::encode_patches(*tower, pv));
      std::copy(e.begin(), e.end(), out);
    }
    // ABI v9: the processor the mmproj's keys describe (touchstone/vision/image_prompt.h),
    // the definition multimodal.preprocess judges other backends by.
    ts_pixel_shape preprocess_image(const ts_image& img, float* out, int64_t n_floats) {
      if (!tower) throw StatusError(TS_ERR_INVALID_ARGUMENT, "preprocess_image: load_vision first");
      const touchstone::vision::Image rgb = touchstone::vision::rgb8_image(
          static_cast<const uint8_t*>(img.data), img.height, img.width);
      return touchstone::abi::pixel_frames(
          touchstone::vision::prompt_image(rgb, tower->config, tower->path).frames, out, n_floats);
    }
  };

  struct Session {
    std::unique_ptr<touchstone::ReferenceTransformer> ref;
    touchstone::reference_backend::GrammarVocabulary* grammar_vocab = nullptr;
    touchstone::Faults faults;
    const touchstone::abi::GrammarState* grammar = nullptr;  // the adapter's, for one fault
    void grammar_changed(const touchstone::abi::GrammarState* g) { grammar = g; }

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
    // ABI v8: caller-supplied input embeddings (ReferenceTransformer::prefill_embeddings).
    int32_t n_embd() const { return n_embd_; }
    void prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all,
                            float* logits) {
      ref->prefill_embeddings(std::span<const float>(e, size_t(n) * size_t(n_embd_)), n,
                              bidirectional && !faults.image_attended_causally, all,
                              std::span<float>(logits, (all ? size_t(n) : 1) * ref->n_vocab()));
    }
    int32_t n_embd_ = 0;
    // The prefill-level faults (causal_mask, prefill_position_reset,
    // logits_row_shift, verify_row_shift) live in ReferenceTransformer::prefill.
    void prefill(std::span<const int32_t> tokens, bool all, float* logits) {
      ref->prefill(tokens, all, std::span<float>(logits, rows(tokens, all)));
    }
    // ABI v6 fork_session: a new transformer holding the first n_prefix KV rows.
    std::unique_ptr<Session> fork(int32_t n_prefix) {
      auto s = std::make_unique<Session>();
      s->ref = ref->fork(n_prefix);
      s->grammar_vocab = grammar_vocab;
      s->faults = faults;
      s->n_embd_ = n_embd_;
      return s;
    }
    // ABI v7: the reference enforces grammars with the harness's own oracle
    // (XGrammar), so a backend-enforced run of the reference is the contract's
    // worked example, and the home of the structured-output faults.
    std::unique_ptr<touchstone::abi::GrammarState> compile_grammar(const ts_grammar& g) {
      return touchstone::reference_backend::compile_grammar(grammar_vocab->get(), g, faults);
    }
    size_t rows(std::span<const int32_t> tokens, bool all) const {
      return (all ? tokens.size() : 1) * size_t(ref->n_vocab());
    }
  };

  // ABI v6 step_batch: the entries one after another, each exactly its own
  // prefill (so no TS_CAP_BATCHED_SESSIONS: a loop, not one forward pass).
  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    std::vector<touchstone::ReferenceTransformer::BatchEntry> entries;
    for (const auto& item : items) {
      entries.push_back(
          {item.session->ref.get(), item.tokens, item.all_positions,
           std::span<float>(item.logits, item.session->rows(item.tokens, item.all_positions))});
    }
    touchstone::ReferenceTransformer::step_batch(entries);
    share_grammar_mask(items);
  }

  // Fault grammar_mask_shared_in_batch: the first constrained entry's allowed set
  // (after the call's tokens) masks every other entry's last logits row.
  static void share_grammar_mask(std::span<const touchstone::abi::BatchItem<Session>> items) {
    const Session* with = nullptr;
    for (const auto& item : items)
      if (item.session->faults.grammar_batch_mask && item.session->grammar && !with)
        with = item.session;
    if (!with) return;
    const int32_t n_vocab = with->ref->n_vocab();
    std::vector<uint32_t> mask(size_t(TS_MASK_WORDS(n_vocab)));
    with->grammar->mask(mask.data(), int32_t(mask.size()));
    for (const auto& item : items) {
      if (item.session == with) continue;
      float* row =
          item.logits + (item.all_positions ? item.tokens.size() - 1 : 0) * size_t(n_vocab);
      for (int32_t t = 0; t < n_vocab; ++t)
        if (!((mask[size_t(t) / 32] >> (t % 32)) & 1u)) row[t] = -INFINITY;
    }
  }

  static std::string device_name() {
    return "CPU (scalar reference, fp64 accumulation, " +
           std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
  }

  static void capabilities(ts_capabilities& c) {
    // One token at a time in fp64 whatever the call: a token's bits never depend
    // on the other tokens of a prefill chunk or a step_batch call, on its only
    // (full-precision) path (batch_invariant_paths 0 = every path).
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM | TS_CAP_BATCH_INVARIANT;
    c.batch_invariant_paths = 0;
    // Everything the dequantizer understands (weight_residency.h: converted to fp32 at load
    // or one row where it is used).
    for (int t : {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 30, 39})  // 39: MXFP4
      c.weight_types |= TS_WEIGHT_TYPE_BIT(t);
    c.max_context = 0;
  }

  // Matrices as stored in the file, or expanded to fp32 when that is small enough
  // (weight_residency.h): the same logits either way.
  static std::unique_ptr<Model> load_model(const std::string& path) {
    return touchstone::abi::load_or_status([&] {
      namespace rb = touchstone::reference_backend;
      touchstone::StoredWeights w = touchstone::load_stored_weights(path);
      if (rb::residency_for(touchstone::fp32_matrix_bytes(w)) == rb::Residency::kFp32)
        touchstone::expand_to_fp32(w);
      return std::make_unique<Model>(
          Model{std::move(w), std::make_unique<rb::GrammarVocabulary>(path), nullptr});
    });
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    if (o.weight_path != TS_WEIGHTS_FULL_PRECISION) {
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "the reference backend computes only with fp32 weights (full_precision)");
    }
    const touchstone::Faults faults = touchstone::abi::session_fault(
        o.fault, {.grammar = true, .moe = true, .sinks = true, .image_attention = true});
    // These serving faults stand for bugs of a fast engine's paged KV cache and
    // flattened batch; the scalar reference does not model them.
    if (faults.fork_shared_kv || faults.batch_all_positions_shift ||
        faults.batch_page_boundary_leak) {
      throw StatusError(
          TS_ERR_UNSUPPORTED,
          "the reference does not implement fault '" + faults.name +
              "' (cpu_simd and vulkan do: docs/metrics.md#fault-catalog-and-margins)");
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
    s->ref = std::make_unique<touchstone::ReferenceTransformer>(m.weights, o.max_context, threads,
                                                                faults);
    s->grammar_vocab = m.grammar_vocab.get();
    s->faults = faults;
    s->n_embd_ = m.weights.config.n_embd;
    return s;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Reference)
