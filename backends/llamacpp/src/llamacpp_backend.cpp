// llamacpp_backend.cpp - llama.cpp (CPU) behind the session contract
// (touchstone/abi/backend_abi.h) through touchstone::BackendAdapter, driving only
// llama.cpp's public C API (llama.h). docs/backends/llamacpp.md.
//
//   load_model    llama_model_load_from_file (CPU, n_gpu_layers 0, mmap)
//   open_session  llama_init_from_model: n_ctx = max_context (0: the model's
//                 n_ctx_train), a unified KV cache for up to kMaxSequences
//                 sequence ids of which the session holds one, F32 KV cache,
//                 full-size SWA cache (so rewind works on Gemma 3's
//                 sliding-window layers)
//   prefill       llama_decode over llama_batch chunks of n_batch tokens, logits
//                 flags on every position (all_positions) or the last one,
//                 llama_get_logits_ith
//   rewind        llama_memory_seq_rm(llama_get_memory(ctx), seq, p, -1)
//   fork_session  a free sequence id of the same context,
//                 llama_memory_seq_cp(seq, new seq, 0, n_prefix): the cells are
//                 shared, as llama-server's slots share a cached prefix
//   step_batch    every entry's session moved into the first entry's context
//                 (llama_state_seq_get_data / _set_data: the KV bits are copied),
//                 then the entries' tokens as sequence ids of one llama_batch
//                 per n_batch tokens: one llama_decode for all of them, as
//                 llama-server's continuous batching does
//   full_precision  an F32 copy written by llama_model_quantize (f32_copy.h)
//   prefill_embeddings  a llama_batch of input embeddings (llama_batch.embd), the
//                 image's rows in one llama_decode with llama_set_causal_attn(false)
//                 when bidirectional, as mtmd_helper_decode_image_chunk does for
//                 Gemma 3 (tools/mtmd/mtmd-helper.cpp)
//   load_vision / encode_image  libmtmd: the mmproj, llama.cpp's own preprocessing of
//                 the decoded image, its tower and projector (llamacpp_vision.h)
//   compile_grammar GBNF through llama.cpp's grammar sampler
//                 (llama_sampler_init_grammar, llamacpp_grammar.h); JSON schema
//                 and regex are TS_ERR_UNSUPPORTED
#include <ggml-cpu.h>
#include <ggml.h>
#include <llama.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "f32_copy.h"
#include "llamacpp_grammar.h"
#include "log_tail.h"
#ifdef TOUCHSTONE_LLAMACPP_MTMD
#include "llamacpp_vision.h"
#endif
#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/abi/backend_impl.h"

namespace touchstone::llamacpp {
namespace {

using touchstone::abi::StatusError;

// ---- llama.cpp's log: nothing reaches stdout/stderr; errors are kept --------
// (the latest ~2 KB) to explain a failed load or decode in last_error().
LogTail g_log(GGML_LOG_LEVEL_ERROR);

void log_callback(ggml_log_level level, const char* text, void*) { g_log.add(level, text); }

// The errors logged since the last call, on one line ("" when none).
std::string take_log_errors() { return g_log.take(); }

std::string with_log(std::string message) {
  const std::string log = take_log_errors();
  return log.empty() ? message : message + " (llama.cpp: " + log + ")";
}

void init_llama() {
  static std::once_flag once;
  std::call_once(once, [] {
    llama_log_set(log_callback, nullptr);
    llama_backend_init();
  });
}

// ---- knobs (environment; docs/backends/llamacpp.md) --------------------------
// Defaults: llama.cpp's most precise CPU attention. F32 KV cache (llama.cpp's
// default is F16) and flash attention off (llama.cpp's default "auto" turns it
// on for the CPU, and llama_graph casts an F32 K/V to F16 before
// ggml_flash_attn_ext: SmolLM2 full_precision NMSE 2e-12 -> 9e-7).
struct Knobs {
  ggml_type kv_type = GGML_TYPE_F32;
  llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
};

Knobs knobs() {
  Knobs k;
  const char* kv = std::getenv("TOUCHSTONE_LLAMACPP_KV");
  const std::string kvs = kv ? kv : "";
  if (kvs == "f16") {
    k.kv_type = GGML_TYPE_F16;
  } else if (!kvs.empty() && kvs != "f32") {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "TOUCHSTONE_LLAMACPP_KV must be f32 or f16, not '" + kvs + "'");
  }
  const char* fa = std::getenv("TOUCHSTONE_LLAMACPP_FLASH_ATTN");
  const std::string fas = fa ? fa : "";
  if (fas == "on") {
    k.flash_attn = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  } else if (fas == "auto") {
    k.flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
  } else if (!fas.empty() && fas != "off") {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "TOUCHSTONE_LLAMACPP_FLASH_ATTN must be auto, on or off, not '" + fas + "'");
  }
  return k;
}

struct ModelFree {
  void operator()(llama_model* m) const { llama_model_free(m); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelFree>;
struct ContextFree {
  void operator()(llama_context* c) const { llama_free(c); }
};
using ContextPtr = std::unique_ptr<llama_context, ContextFree>;

ModelPtr load_llama_model(const std::string& path) {
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw StatusError(TS_ERR_IO, "cannot open " + path);
  }
  init_llama();
  take_log_errors();
  llama_model_params p = llama_model_default_params();
  p.n_gpu_layers = 0;                  // CPU only (this build has no other device)
  p.load_mode = LLAMA_LOAD_MODE_MMAP;  // use_mmap
  ModelPtr m(llama_model_load_from_file(path.c_str(), p));
  if (!m) {
    const std::string log = take_log_errors();
    const ts_status st = log.find("unknown model architecture") != std::string::npos
                             ? TS_ERR_UNSUPPORTED
                             : TS_ERR_IO;
    throw StatusError(st, "llama.cpp cannot load " + path + (log.empty() ? "" : ": " + log));
  }
  return m;
}

struct LlamaCpp {
  static constexpr const char* name = "llamacpp";
  static constexpr const char* version = TOUCHSTONE_LLAMACPP_VERSION;
  // ABI v3: the Touchstone families llama.cpp loads; it computes every feature
  // of them (docs/model-families.md).
  static constexpr const char* architectures =
      "llama,qwen2,qwen3,qwen3moe,gpt-oss,gemma3,phi3,qwen2moe";
  static constexpr const char* model_features = "*";

  struct Model {
    std::string path;
    ModelPtr quantized;
    ModelPtr f32;  // full_precision, loaded on first use
    std::mutex f32_mu;
    int32_t vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_vocab() const { return vocab; }
#ifdef TOUCHSTONE_LLAMACPP_MTMD
    std::unique_ptr<MtmdTower> tower;  // ABI v8 load_vision (libmtmd)
    // ABI v8: llama.cpp's own vision path (llamacpp_vision.h), tied to the file's model.
    void load_vision(const std::string& mmproj) {
      init_llama();
      tower = std::make_unique<MtmdTower>(mmproj, quantized.get(),
                                          int32_t(std::thread::hardware_concurrency()));
    }
    void encode_image(const ts_image& img, float* out, int64_t n_floats) {
      if (!tower) throw StatusError(TS_ERR_INVALID_ARGUMENT, "encode_image: load_vision first");
      tower->encode(img, out, n_floats);
    }
    // ABI v9: the pixel tensor libmtmd's tower receives (llamacpp_vision.h).
    ts_pixel_shape preprocess_image(const ts_image& img, float* out, int64_t n_floats) {
      if (!tower) throw StatusError(TS_ERR_INVALID_ARGUMENT, "preprocess_image: load_vision first");
      return tower->pixels(img, out, n_floats);
    }
#endif

    llama_model* weights(bool quant) {
      if (quant) return quantized.get();
      std::lock_guard<std::mutex> lock(f32_mu);
      if (!f32) {
        f32 = load_llama_model(f32_copy(path));
        if (llama_vocab_n_tokens(llama_model_get_vocab(f32.get())) != vocab)
          throw StatusError(TS_ERR_INTERNAL, "F32 copy of " + path + " has another vocabulary");
      }
      return f32.get();
    }
  };

  class Session;

  // One llama_context (a unified KV cache) and the sessions that hold its
  // sequence ids. A session opens its own; fork and step_batch put several
  // sessions in one, so that their tokens can share a llama_batch.
  struct Context {
    static constexpr int32_t kMaxSequences = 32;
    ContextPtr ctx;
    llama_batch batch{};
    int32_t n_batch = 0;
    int32_t cells = 0;     // n_ctx: the KV cells every session of this context shares
    int32_t reserved = 0;  // the max_context of the sessions opened in or moved here
    int32_t n_vocab = 0;
    int32_t threads = 0;
    llama_model* model = nullptr;
    Knobs knobs;
    std::vector<bool> in_use;  // per sequence id: held by a session

    Context(llama_model* m, int32_t n_cells, int32_t n_threads, const Knobs& k);
    ~Context() { llama_batch_free(batch); }
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
    llama_memory_t memory() const { return llama_get_memory(ctx.get()); }
    llama_seq_id acquire();  // a free sequence id (throws when none is left)
    void release(llama_seq_id seq);
    // Runs the first `n` tokens of `batch`; a status error names `what`.
    void decode(int32_t n, const std::string& what);
  };

  class Session {
   public:
    // reserve: count cap against the context's cells (an opened or moved
    // session; a fork shares its source's cells and reserves none).
    Session(std::shared_ptr<Context> c, llama_seq_id seq, int32_t pos, int32_t cap, bool reserve)
        : ctx_(std::move(c)), seq_(seq), pos_(pos), cap_(cap), reserved_(reserve) {
      if (reserved_) ctx_->reserved += cap_;
    }
    ~Session() {
      if (reserved_) ctx_->reserved -= cap_;
      ctx_->release(seq_);
    }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    int32_t position() const { return pos_; }
    int32_t max_context() const { return cap_; }
    void prefill(std::span<const int32_t> t, bool all, float* logits);
    // ABI v8: input embeddings (the image's tokens).
    int32_t n_embd() const { return llama_model_n_embd(ctx_->model); }
    void prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all, float* logits);
    int32_t prefill_greedy(std::span<const int32_t> t);
    void rewind(int32_t p);
    std::unique_ptr<Session> fork(int32_t n_prefix);
    // Copies this session's KV cells into `to` under a new sequence id and
    // leaves its old context (a step_batch with sessions of other contexts).
    void move_to(const std::shared_ptr<Context>& to);
    static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items);
    // ABI v7: the grammar as llama.cpp's own grammar sampler enforces it.
    std::unique_ptr<touchstone::abi::GrammarState> compile_grammar(const ts_grammar& g);

   private:
    // Appends the tokens; calls row(i, logits of token i) for every output row.
    template <typename Row>
    void append(std::span<const int32_t> t, bool all, Row&& row);
    void undo(int32_t to);

    // The context every entry's session moves into (the first entry's when it
    // has the cells and sequence ids to spare, else a new one sized for all).
    static std::shared_ptr<Context> batch_context(
        std::span<const touchstone::abi::BatchItem<Session>> items);

    std::shared_ptr<Context> ctx_;
    llama_seq_id seq_ = 0;
    int32_t pos_ = 0;
    int32_t cap_ = 0;
    bool reserved_ = false;
  };

  static std::string device_name() {
    init_llama();
    const Knobs k = knobs();
    return touchstone::abi::cpu_device_name() + "); llama.cpp " +
           std::string(TOUCHSTONE_LLAMACPP_VERSION) + " (llama-cpp-python sdist), KV cache " +
           ggml_type_name(k.kv_type) + ", flash attention " +
           llama_flash_attn_type_name(k.flash_attn) + "; " + llama_print_system_info();
  }

  static void capabilities(ts_capabilities& c) {
    // Bitwise determinism (measured, docs/backends/llamacpp.md#determinism):
    // without flash attention every ggml CPU op splits its work by output rows,
    // each element one thread's full reduction. With it, a decode over >= 512 KV
    // cells splits the KV range across the threads and merges the partial
    // softmaxes (ggml_flash_attn_ext_reduce_partials): thread-count dependent.
    c.flags = TS_CAP_ALL_POSITION_LOGITS;
    if (knobs().flash_attn == LLAMA_FLASH_ATTN_TYPE_DISABLED) {
      // Not across fork_session: a fork shares its source's KV cells
      // (llama_memory_seq_cp), so the fork's and the source's later tokens take
      // cells after each other's and attention sums the cells in another order
      // than in a fresh session fed the same calls (measured: prefix_fork max
      // |diff| 2.1e-5 on F32, 1.7 on Gemma 3 Q4_K_M; docs/backends/llamacpp.md#serving).
      c.flags |= TS_CAP_BITWISE_DETERMINISM | TS_CAP_BITWISE_NOT_ACROSS_FORKS;
    } else {
      c.determinism_note =
          "TOUCHSTONE_LLAMACPP_FLASH_ATTN: decode splits the KV range across threads once it "
          "holds >= 512 cells, so results depend on the thread count";
    }
    // Every type the CPU backend has a dot product for (a matmul weight type;
    // Q8_1, Q8_K are activation-only, I8..I64 and F64 have none).
    for (int t = 0; t < GGML_TYPE_COUNT && t < 64; ++t) {
      if (ggml_get_type_traits_cpu(ggml_type(t))->vec_dot) c.weight_types |= TS_WEIGHT_TYPE_BIT(t);
    }
    c.max_context = 0;
    // ABI v6: step_batch is one llama_decode per n_batch tokens of every entry
    // (continuous batching), fork_session shares the KV cells of the prefix.
    // No batch-invariance claim: the serving checks measure what llama.cpp does
    // (docs/backends/llamacpp.md#serving).
    c.flags |= TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY;
    c.max_batch = 16;
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    auto m = std::make_unique<Model>();
    m->path = path;
    m->quantized = load_llama_model(path);
    m->vocab = llama_vocab_n_tokens(llama_model_get_vocab(m->quantized.get()));
    m->n_ctx_train = llama_model_n_ctx_train(m->quantized.get());
    if (m->vocab <= 0) throw StatusError(TS_ERR_IO, path + ": no vocabulary");
    return m;
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    if (o.fault && *o.fault) {
      throw StatusError(TS_ERR_UNSUPPORTED, std::string("fault '") + o.fault +
                                                "': the llamacpp backend injects no faults");
    }
    const Knobs k = knobs();
    int32_t cap = o.max_context > 0 ? o.max_context : m.n_ctx_train;
    if (m.n_ctx_train > 0) cap = std::min(cap, m.n_ctx_train);
    if (cap <= 0) throw StatusError(TS_ERR_INVALID_ARGUMENT, "model has no context length");
    llama_model* w = m.weights(o.weight_path == TS_WEIGHTS_QUANTIZED);
    auto c = std::make_shared<Context>(w, cap, o.n_threads, k);
    const llama_seq_id seq = c->acquire();
    return std::make_unique<Session>(std::move(c), seq, 0, cap, true);
  }

  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    Session::step_batch(items);
  }
};

LlamaCpp::Context::Context(llama_model* m, int32_t n_cells, int32_t n_threads, const Knobs& k)
    : cells(n_cells),
      n_vocab(llama_vocab_n_tokens(llama_model_get_vocab(m))),
      threads(n_threads > 0 ? n_threads
                            : int32_t(std::max(1u, std::thread::hardware_concurrency()))),
      model(m),
      knobs(k) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = uint32_t(cells);
  p.n_batch = 512;
  p.n_ubatch = 512;
  // llama.cpp reserves an output row per sequence within n_batch = min(n_ctx, 512).
  in_use.assign(size_t(std::min(kMaxSequences, cells)), false);
  p.n_seq_max = uint32_t(in_use.size());
  p.kv_unified = true;  // one cell pool: a fork shares its prefix's cells
  p.n_threads = threads;
  p.n_threads_batch = threads;
  p.type_k = k.kv_type;
  p.type_v = k.kv_type;
  p.flash_attn_type = k.flash_attn;
  p.swa_full = true;  // rewind on sliding-window layers needs the evicted cells
  p.no_perf = true;
  p.offload_kqv = false;
  p.op_offload = false;
  take_log_errors();
  ctx.reset(llama_init_from_model(m, p));
  if (!ctx) {
    throw StatusError(TS_ERR_OUT_OF_MEMORY, with_log("llama_init_from_model failed (n_ctx " +
                                                     std::to_string(cells) + ")"));
  }
  n_batch = int32_t(std::min(llama_n_batch(ctx.get()), llama_n_ubatch(ctx.get())));
  if (n_batch <= 0) throw StatusError(TS_ERR_INTERNAL, "llama.cpp reports n_batch 0");
  batch = llama_batch_init(n_batch, 0, 1);
}

llama_seq_id LlamaCpp::Context::acquire() {
  for (size_t i = 0; i < in_use.size(); ++i) {
    if (!in_use[i]) {
      in_use[i] = true;
      return llama_seq_id(i);
    }
  }
  throw StatusError(TS_ERR_OUT_OF_MEMORY, "llama.cpp context: all " +
                                              std::to_string(in_use.size()) +
                                              " sequence ids are held by live sessions");
}

void LlamaCpp::Context::release(llama_seq_id seq) {
  llama_memory_seq_rm(memory(), seq, -1, -1);
  in_use[size_t(seq)] = false;
}

void LlamaCpp::Context::decode(int32_t n, const std::string& what) {
  batch.n_tokens = n;
  take_log_errors();
  const int32_t rc = llama_decode(ctx.get(), batch);
  if (rc != 0) {
    // 1: no KV slot for the batch (the cells are shared by the context's sessions).
    const ts_status st = rc == 1 ? TS_ERR_CONTEXT_FULL : TS_ERR_INTERNAL;
    throw StatusError(st, with_log("llama_decode returned " + std::to_string(rc) + " " + what));
  }
}

// Drops every KV cell of this session at positions >= `to` (after a failed
// decode, or rewind).
void LlamaCpp::Session::undo(int32_t to) {
  if (!llama_memory_seq_rm(ctx_->memory(), seq_, to, -1)) {
    throw StatusError(TS_ERR_INTERNAL, with_log("llama_memory_seq_rm(seq " + std::to_string(seq_) +
                                                ", " + std::to_string(to) + ", -1) failed"));
  }
}

template <typename Row>
void LlamaCpp::Session::append(std::span<const int32_t> t, bool all, Row&& row) {
  const int32_t start = pos_;
  const int32_t n = int32_t(t.size());
  Context& c = *ctx_;
  try {
    for (int32_t done = 0; done < n; done += c.n_batch) {
      const int32_t take = std::min(c.n_batch, n - done);
      const bool last_chunk = done + take == n;
      for (int32_t i = 0; i < take; ++i) {
        c.batch.token[i] = t[size_t(done + i)];
        c.batch.pos[i] = start + done + i;
        c.batch.n_seq_id[i] = 1;
        c.batch.seq_id[i][0] = seq_;
        c.batch.logits[i] = int8_t(all || (last_chunk && i == take - 1));
      }
      c.decode(take, "at position " + std::to_string(start + done));
      for (int32_t i = all ? 0 : take - 1; i < take && (all || last_chunk); ++i) {
        const float* logits = llama_get_logits_ith(c.ctx.get(), i);
        if (!logits) throw StatusError(TS_ERR_INTERNAL, with_log("llama_get_logits_ith failed"));
        row(done + i, logits);
      }
    }
  } catch (...) {
    // A failed call leaves the session as it was (best effort: the first error wins).
    llama_memory_seq_rm(c.memory(), seq_, start, -1);
    throw;
  }
  pos_ = start + n;
}

void LlamaCpp::Session::prefill(std::span<const int32_t> t, bool all, float* logits) {
  const size_t V = size_t(ctx_->n_vocab);
  append(t, all, [&](int32_t i, const float* row) {
    float* out = all ? logits + size_t(i) * V : logits;
    std::memcpy(out, row, V * sizeof(float));
  });
}

// The rows in llama_batch chunks of n_batch (a bidirectional block: one chunk, as
// llama.cpp needs the whole non-causal block in one ubatch), each a llama_decode.
void LlamaCpp::Session::prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all,
                                           float* logits) {
  Context& c = *ctx_;
  if (bidirectional && n > c.n_batch) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "prefill_embeddings: a bidirectional block of " + std::to_string(n) +
                          " embeddings; llama.cpp's non-causal block must fit one ubatch of " +
                          std::to_string(c.n_batch));
  }
  const size_t d = size_t(n_embd()), V = size_t(c.n_vocab);
  const int32_t start = pos_;
  llama_batch b = llama_batch_init(std::min(n, c.n_batch), int32_t(d), 1);
  if (bidirectional) llama_set_causal_attn(c.ctx.get(), false);
  try {
    for (int32_t done = 0; done < n; done += c.n_batch) {
      const int32_t take = std::min(c.n_batch, n - done);
      const bool last = done + take == n;
      std::memcpy(b.embd, e + size_t(done) * d, size_t(take) * d * sizeof(float));
      for (int32_t i = 0; i < take; ++i) {
        b.pos[i] = start + done + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = seq_;
        b.logits[i] = int8_t(all || (last && i == take - 1));
      }
      b.n_tokens = take;
      take_log_errors();
      const int32_t rc = llama_decode(c.ctx.get(), b);
      if (rc != 0)
        throw StatusError(
            rc == 1 ? TS_ERR_CONTEXT_FULL : TS_ERR_INTERNAL,
            with_log("llama_decode of input embeddings returned " + std::to_string(rc) +
                     " at position " + std::to_string(start + done)));
      for (int32_t i = all ? 0 : take - 1; i < take && (all || last); ++i) {
        const float* row = llama_get_logits_ith(c.ctx.get(), i);
        if (!row) throw StatusError(TS_ERR_INTERNAL, with_log("llama_get_logits_ith failed"));
        std::memcpy(all ? logits + size_t(done + i) * V : logits, row, V * sizeof(float));
      }
    }
  } catch (...) {
    if (bidirectional) llama_set_causal_attn(c.ctx.get(), true);
    llama_batch_free(b);
    llama_memory_seq_rm(c.memory(), seq_, start, -1);
    throw;
  }
  if (bidirectional) llama_set_causal_attn(c.ctx.get(), true);
  llama_batch_free(b);
  pos_ = start + n;
}

// The "device" is the CPU: the argmax runs on llama.cpp's own logits buffer.
int32_t LlamaCpp::Session::prefill_greedy(std::span<const int32_t> t) {
  int32_t token = -1;
  append(t, false, [&](int32_t, const float* row) {
    token = touchstone::abi::greedy_argmax(row, ctx_->n_vocab);
  });
  return token;
}

void LlamaCpp::Session::rewind(int32_t p) {
  undo(p);
  pos_ = p;
}

std::unique_ptr<LlamaCpp::Session> LlamaCpp::Session::fork(int32_t n_prefix) {
  const llama_seq_id seq = ctx_->acquire();
  auto out = std::make_unique<Session>(ctx_, seq, n_prefix, cap_, false);
  if (n_prefix > 0) llama_memory_seq_cp(ctx_->memory(), seq_, seq, 0, n_prefix);
  return out;
}

void LlamaCpp::Session::move_to(const std::shared_ptr<Context>& to) {
  const llama_seq_id seq = to->acquire();
  try {
    const size_t n = llama_state_seq_get_size(ctx_->ctx.get(), seq_);
    std::vector<uint8_t> state(n);
    take_log_errors();
    if (llama_state_seq_get_data(ctx_->ctx.get(), state.data(), n, seq_) != n ||
        llama_state_seq_set_data(to->ctx.get(), state.data(), n, seq) == 0) {
      throw StatusError(TS_ERR_CONTEXT_FULL,
                        with_log("step_batch: cannot move a session's " + std::to_string(pos_) +
                                 " KV cells into the first entry's llama.cpp context (its " +
                                 std::to_string(to->cells) + " cells are shared)"));
    }
  } catch (...) {
    to->release(seq);
    throw;
  }
  if (reserved_) ctx_->reserved -= cap_;
  ctx_->release(seq_);
  ctx_ = to;
  seq_ = seq;
  reserved_ = true;
  ctx_->reserved += cap_;
}

// Every entry's tokens, entry after entry, in llama_batch chunks of n_batch
// tokens (each token tagged with its session's sequence id and position): one
// llama_decode per chunk for all the sessions, as continuous batching does.
std::shared_ptr<LlamaCpp::Context> LlamaCpp::Session::batch_context(
    std::span<const touchstone::abi::BatchItem<Session>> items) {
  std::shared_ptr<Context> first = items[0].session->ctx_;
  int64_t need = first->reserved, all = 0;
  int32_t ids = 0;
  for (const auto& it : items) {
    all += it.session->cap_;
    if (it.session->ctx_ == first) continue;
    need += it.session->cap_;
    ++ids;
  }
  if (ids == 0) return first;
  const auto free_ids = std::count(first->in_use.begin(), first->in_use.end(), false);
  if (need <= first->cells && ids <= free_ids) return first;
  if (all > std::numeric_limits<int32_t>::max())
    throw StatusError(TS_ERR_OUT_OF_MEMORY, "step_batch: the sessions' contexts add up to " +
                                                std::to_string(all) + " KV cells");
  return std::make_shared<Context>(first->model, int32_t(all), first->threads, first->knobs);
}

void LlamaCpp::Session::step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
  const std::shared_ptr<Context> shared = batch_context(items);
  for (const auto& it : items)
    if (it.session->ctx_ != shared) it.session->move_to(shared);
  struct Slot {
    size_t entry;
    int32_t token;
  };
  std::vector<Slot> order;
  for (size_t e = 0; e < items.size(); ++e)
    for (int32_t j = 0; j < int32_t(items[e].tokens.size()); ++j) order.push_back({e, j});
  Context& c = *shared;
  const size_t V = size_t(c.n_vocab);
  try {
    for (size_t done = 0; done < order.size(); done += size_t(c.n_batch)) {
      const int32_t take = int32_t(std::min(order.size() - done, size_t(c.n_batch)));
      for (int32_t i = 0; i < take; ++i) {
        const auto& [e, j] = order[done + size_t(i)];
        const auto& it = items[e];
        c.batch.token[i] = it.tokens[size_t(j)];
        c.batch.pos[i] = it.session->pos_ + j;
        c.batch.n_seq_id[i] = 1;
        c.batch.seq_id[i][0] = it.session->seq_;
        c.batch.logits[i] = int8_t(it.all_positions || j + 1 == int32_t(it.tokens.size()));
      }
      c.decode(take, "in step_batch (" + std::to_string(items.size()) + " entries)");
      for (int32_t i = 0; i < take; ++i) {
        if (!c.batch.logits[i]) continue;
        const auto& [e, j] = order[done + size_t(i)];
        const float* row = llama_get_logits_ith(c.ctx.get(), i);
        if (!row) throw StatusError(TS_ERR_INTERNAL, with_log("llama_get_logits_ith failed"));
        float* out = items[e].logits + (items[e].all_positions ? size_t(j) * V : 0);
        std::memcpy(out, row, V * sizeof(float));
      }
    }
  } catch (...) {
    for (const auto& it : items)
      llama_memory_seq_rm(c.memory(), it.session->seq_, it.session->pos_, -1);
    throw;
  }
  for (const auto& it : items) it.session->pos_ += int32_t(it.tokens.size());
}

std::unique_ptr<touchstone::abi::GrammarState> LlamaCpp::Session::compile_grammar(
    const ts_grammar& g) {
  int kind = 0;  // read as an integer, as the adapter does
  static_assert(sizeof kind == sizeof g.kind);
  std::memcpy(&kind, &g.kind, sizeof kind);
  if (kind == TS_GRAMMAR_JSON_SCHEMA) {
    // llama.cpp converts a schema with json_schema_to_grammar (libllama-common,
    // common/json-schema-to-grammar.h): the library is in the cache prefix, its
    // headers are not (ci/llamacpp installs llama.h and ggml*.h only).
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "json_schema: llama.cpp's schema converter (json_schema_to_grammar in "
                      "libllama-common) has no installed header in this build; pass the "
                      "grammar as GBNF");
  }
  if (kind != TS_GRAMMAR_GBNF) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "regex: llama.cpp's grammar sampler takes GBNF (llama_sampler_init_grammar)");
  }
  take_log_errors();
  std::string error;
  std::unique_ptr<LlamaGrammar> state =
      compile_gbnf(llama_model_get_vocab(ctx_->model), g.text, error);
  if (!state) {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      with_log("llama.cpp refuses the GBNF grammar" +
                               (error.empty() ? std::string() : ": " + error)));
  }
  return state;
}

}  // namespace
}  // namespace touchstone::llamacpp

TOUCHSTONE_BACKEND_ENTRY(touchstone::llamacpp::LlamaCpp)
