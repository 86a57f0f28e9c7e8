// touchstone/abi/backend_adapter.hpp - write a Touchstone backend as a C++ class.
//
// The session contract is the C table in touchstone/abi/backend_abi.h. This
// header-only helper (C++20, standard library only) builds that table from a
// class, in the spirit of ggml's GGML_BACKEND_DL_IMPL, and applies the checks
// every backend must apply identically: null pointers, struct_size, weight path,
// token ids in [0, n_vocab), room in the KV cache, rewind range. Exceptions
// never cross the ABI: StatusError becomes its status, std::bad_alloc
// TS_ERR_OUT_OF_MEMORY, any other exception TS_ERR_INTERNAL; the message is
// kept for last_error().
//
//   struct MyBackend {
//     static constexpr const char* name = "mine";     // ts_backend.name
//     static constexpr const char* version = "0.1.0";
//     static constexpr const char* architectures = "llama";  // optional (ABI v3)
//     static constexpr const char* model_features = "";      // optional (ABI v3)
//     struct Model {                       // weights, in the backend's layout
//       int32_t n_vocab() const;
//     };
//     struct Session {                     // owns its KV cache
//       int32_t position() const;          // tokens in the KV cache
//       int32_t max_context() const;       // tokens it can hold
//       // logits: n_vocab floats, or tokens.size() * n_vocab when all_positions
//       void prefill(std::span<const int32_t> tokens, bool all_positions, float* logits);
//       void rewind(int32_t position);     // 0 <= position <= position(), checked
//       // optional: void decode(int32_t token, float* logits);  (else prefill of 1)
//       // optional: int32_t prefill_greedy(std::span<const int32_t> tokens);
//       //           (sets TS_CAP_DEVICE_GREEDY; lowest id among equal maxima)
//       // optional: void set_taps(bool on); void read_taps(float* out, int64_t n);
//       // optional (ABI v6): std::unique_ptr<Session> fork(int32_t n_prefix);
//       //           (fork_session; sets TS_CAP_KV_PREFIX_COPY; 0 <= n_prefix <=
//       //           position() checked; the result must report position() == n_prefix)
//     };
//       // optional (ABI v7): std::unique_ptr<abi::GrammarState>
//       //           compile_grammar(const ts_grammar& g);  (sets TS_CAP_STRUCTURED_OUTPUT;
//       //           the adapter then keeps the grammar in step with every call, below)
//       // optional (ABI v7): void grammar_changed(const abi::GrammarState* g);
//       //           (told the session's grammar state whenever it is set, cloned by a
//       //           fork or removed; nullptr = none. The adapter owns it.)
//       // optional (ABI v8): int32_t n_embd() const; and
//       //           void prefill_embeddings(const float* embd, int32_t n, bool bidirectional,
//       //                                   bool all_positions, float* logits);
//       //           (sets TS_CAP_EMBEDDING_INPUT; embd: n x n_embd() floats; room, sizes
//       //           and "no grammar set" checked)
//     // optional (ABI v8), on Model: void load_vision(const std::string& mmproj_path);
//     //   void encode_image(const ts_image& image, float* out, int64_t n_floats);
//     //   (sets TS_CAP_MULTIMODAL; the image's pointer, format and sizes checked; the
//     //   Model checks the format it takes, that a tower is loaded and that n_floats is
//     //   its output's size)
//     // optional (ABI v9), on Model, with the two above:
//     //   ts_pixel_shape preprocess_image(const ts_image& rgb8, float* out, int64_t n_floats);
//     //   (out nullptr: the shape only; the image's pointer and sizes and the RGB8 format
//     //   checked; the Model checks n_floats against the shape it returns)
//     //   void set_vision_fault(const std::string& fault);  ("" = none; refuses with
//     //   abi::StatusError(TS_ERR_UNSUPPORTED) a fault it does not implement)
//     // optional (ABI v6): static void step_batch(std::span<const abi::BatchItem<Session>>);
//     //   (step_batch; every entry already checked: distinct sessions of one model
//     //   and weight path, tokens, room, buffers. Set TS_CAP_BATCHED_SESSIONS in
//     //   capabilities() only when it is one forward pass. If it throws, the
//     //   adapter rewinds every session to where it was.)
//     static std::string device_name();
//     static void capabilities(ts_capabilities& caps);  // zeroed, struct_size set
//     static std::unique_ptr<Model> load_model(const std::string& gguf_path);
//     static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o);
//   };
//   TOUCHSTONE_BACKEND_ENTRY(MyBackend)   // exports touchstone_backend_entry
//
// Throw touchstone::abi::StatusError(TS_ERR_UNSUPPORTED, "why") for a weight
// type, family or option the backend does not compute, TS_ERR_IO for a file it
// cannot read, TS_ERR_DEVICE when there is no usable device.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "touchstone/abi/backend_abi.h"

namespace touchstone::abi {

// An error with the ts_status it maps to at the ABI.
class StatusError : public std::runtime_error {
 public:
  StatusError(ts_status status, const std::string& what)
      : std::runtime_error(what), status_(status) {}
  ts_status status() const { return status_; }

 private:
  ts_status status_;
};

inline std::string& last_error_storage() {
  thread_local std::string message;
  return message;
}

inline const char* last_error() { return last_error_storage().c_str(); }

// ---- checks every backend applies identically (same status, same message) ----

// TS_ERR_INVALID_ARGUMENT naming the index and value of the first token outside [0, n_vocab).
inline void check_tokens(const int32_t* tokens, int64_t n, int64_t n_vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT, "token #" + std::to_string(i) + " = " +
                                                     std::to_string(tokens[i]) + " outside [0, " +
                                                     std::to_string(n_vocab) + ")");
    }
  }
}

// TS_ERR_CONTEXT_FULL when appending n tokens at `position` would exceed max_context.
inline void check_room(int64_t position, int64_t n, int64_t max_context) {
  if (position + n > max_context) {
    throw StatusError(TS_ERR_CONTEXT_FULL, "position " + std::to_string(position) + " + " +
                                               std::to_string(n) + " tokens exceeds max context " +
                                               std::to_string(max_context));
  }
}

// TS_ERR_INVALID_ARGUMENT unless 0 <= to <= position.
inline void check_rewind(int64_t to, int64_t position) {
  if (to < 0 || to > position) {
    throw StatusError(TS_ERR_INVALID_ARGUMENT, "rewind to " + std::to_string(to) + " outside [0, " +
                                                   std::to_string(position) + "]");
  }
}

// The greedy token of one logits row as prefill_greedy defines it: lowest id
// among equal maxima, NaN never wins. Throws TS_ERR_INTERNAL when every logit is NaN.
inline int32_t greedy_argmax(const float* logits, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (logits[i] != logits[i]) continue;  // NaN
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  if (best < 0) throw StatusError(TS_ERR_INTERNAL, "greedy: every logit is NaN");
  return static_cast<int32_t>(best);
}

// read_taps (ABI v4) for a backend that keeps its last record in host memory:
// TS_ERR_INVALID_ARGUMENT when nothing was recorded or n differs from its size.
inline void copy_taps(const float* taps, size_t size, float* out, int64_t n) {
  if (!out) throw StatusError(TS_ERR_INVALID_ARGUMENT, "read_taps: null buffer");
  if (size == 0) {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "read_taps: nothing recorded (set_taps(1) first, then a call)");
  }
  if (n < 0 || uint64_t(n) != size) {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      "read_taps: n_floats " + std::to_string(n) + " != n_layer x " +
                          std::to_string(TS_TAP_POINTS) + " x n_embd = " + std::to_string(size));
  }
  for (size_t i = 0; i < size; ++i) out[i] = taps[i];
}

// Runs f; any exception becomes a status (and last_error()'s message).
template <typename F>
ts_status guard(F&& f) noexcept {
  try {
    f();
    last_error_storage().clear();
    return TS_OK;
  } catch (const StatusError& e) {
    last_error_storage() = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    last_error_storage() = "out of memory";
    return TS_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error_storage() = e.what();
    return TS_ERR_INTERNAL;
  } catch (...) {
    last_error_storage() = "unknown exception";
    return TS_ERR_INTERNAL;
  }
}

inline void require(bool ok, const char* message) {
  if (!ok) throw StatusError(TS_ERR_INVALID_ARGUMENT, message);
}

// One entry of a step_batch call (ABI v6) as the backend class sees it, after
// the adapter's checks: logits holds tokens.size() * n_vocab floats when
// all_positions, else n_vocab.
template <class Session>
struct BatchItem {
  Session* session = nullptr;
  std::span<const int32_t> tokens;
  bool all_positions = false;
  float* logits = nullptr;
};

// A compiled grammar's state for one sequence (ABI v7 structured output), as a
// backend that enforces grammars provides it from Session::compile_grammar.
// The adapter owns it and keeps it in step with the KV cache: every appended
// token goes through accept() before the backend computes anything (a refusal
// fails the call and rolls back the tokens of that call already accepted);
// rewind rolls it back, fork_session clones it. Masks use the TS_MASK_WORDS layout.
class GrammarState {
 public:
  virtual ~GrammarState() = default;
  // Advances by one token; false (state unchanged) when the grammar refuses it
  // here, a stop token where the sentence may not end and anything after a stop
  // token included.
  virtual bool accept(int32_t token) = 0;
  // Undoes the last n accepted tokens (0 <= n <= the number accepted).
  virtual void rollback(int32_t n) = 0;
  // The allowed set now: n_words words, all bits at and above n_vocab zero.
  virtual void mask(uint32_t* words, int32_t n_words) const = 0;
  // An independent state equal to this one.
  virtual std::unique_ptr<GrammarState> clone() const = 0;
};

// The constrained greedy pick of one logits row: the argmax over the tokens the
// mask allows (lowest id on ties, NaN never wins), -1 when none is allowed.
inline int32_t masked_argmax(const float* logits, int64_t n, const uint32_t* mask) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!((mask[i / 32] >> (i % 32)) & 1u) || logits[i] != logits[i]) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// The Session members that only forward to an engine's own session class E,
// written once. E spells them: position(), max_context(), prefill(const
// int32_t* tokens, int32_t n, bool all_positions, float* logits), rewind(int32_t);
// with layer taps also set_taps(bool) and taps() (a contiguous float container,
// the last record). A backend's Session derives from EngineSession<E> and adds
// what its engine does differently (prefill_greedy, decode, fork):
//   struct Session : touchstone::abi::EngineSession<MyEngineSession> { ... };
// set_taps/read_taps exist only when E has them (the adapter then sets TS_CAP_TAPS).
template <class E>
struct EngineSession {
  std::unique_ptr<E> s;
  int32_t position() const { return s->position(); }
  int32_t max_context() const { return s->max_context(); }
  void prefill(std::span<const int32_t> t, bool all_positions, float* logits) {
    s->prefill(t.data(), int32_t(t.size()), all_positions, logits);
  }
  void rewind(int32_t position) { s->rewind(position); }
  void set_taps(bool on) requires requires(E& e) { e.set_taps(on); }
  { s->set_taps(on); }
  void read_taps(float* out, int64_t n) requires requires(E& e) { e.taps().data(); }
  { copy_taps(s->taps().data(), s->taps().size(), out, n); }
};

}  // namespace touchstone::abi

namespace touchstone {

// Builds the ts_backend table of Impl (see the top of this file).
template <class Impl>
class BackendAdapter {
  using Model = typename Impl::Model;
  using Session = typename Impl::Session;
  struct ModelBox {
    std::unique_ptr<Model> model;
    int32_t n_vocab = 0;
  };
  struct SessionBox {
    std::unique_ptr<Session> session;
    int32_t n_vocab = 0;
    const ModelBox* model = nullptr;  // step_batch: one model per call
    int weight_path = 0;              // step_batch: one weight path per call
    // ABI v7: the grammar (null = none) and the position it was set at; the
    // logits rows of the last call (its last row, or every row when a grammar
    // was set during an all-positions call), for grammar_greedy.
    std::unique_ptr<abi::GrammarState> grammar;
    int32_t grammar_start = 0;
    std::vector<float> last_rows;
    int32_t n_last_rows = 0;
  };
  static ModelBox* box(ts_model* m) { return reinterpret_cast<ModelBox*>(m); }
  static const ModelBox* box(const ts_model* m) { return reinterpret_cast<const ModelBox*>(m); }
  static SessionBox* box(ts_session* s) { return reinterpret_cast<SessionBox*>(s); }
  static const SessionBox* box(const ts_session* s) {
    return reinterpret_cast<const SessionBox*>(s);
  }

  static constexpr bool kGreedy = requires(Session & s, std::span<const int32_t> t) {
    { s.prefill_greedy(t) } -> std::convertible_to<int32_t>;
  };
  static constexpr bool kTaps = requires(Session & s, float* out, int64_t n) {
    s.set_taps(true);
    s.read_taps(out, n);
  };
  static constexpr bool kDecode = requires(Session & s, int32_t t, float* out) {
    s.decode(t, out);
  };
  static constexpr bool kFork = requires(Session & s, int32_t n) {
    { s.fork(n) } -> std::convertible_to<std::unique_ptr<Session>>;
  };
  static constexpr bool kStepBatch = requires(std::span<const abi::BatchItem<Session>> items) {
    Impl::step_batch(items);
  };
  static constexpr bool kGrammar = requires(Session & s, const ts_grammar& g) {
    { s.compile_grammar(g) } -> std::convertible_to<std::unique_ptr<abi::GrammarState>>;
  };
  static constexpr bool kEmbeddings = requires(Session & s, const float* e, float* out) {
    { s.n_embd() } -> std::convertible_to<int32_t>;
    s.prefill_embeddings(e, int32_t{1}, true, true, out);
  };
  static constexpr bool kVision = requires(Model & m, const ts_image& img, float* out) {
    m.load_vision(std::string());
    m.encode_image(img, out, int64_t{1});
  };
  static constexpr bool kPreprocess =
      kVision && requires(Model & m, const ts_image& img, float* out) {
    { m.preprocess_image(img, out, int64_t{1}) } -> std::convertible_to<ts_pixel_shape>;
  };
  static constexpr bool kVisionOptions = kVision && requires(Model & m) {
    m.set_vision_fault(std::string());
  };
  // Tells the session which grammar state is its own now (optional hook).
  static void grammar_changed(SessionBox& b) {
    if constexpr (requires(Session & s, const abi::GrammarState* g) { s.grammar_changed(g); })
      b.session->grammar_changed(b.grammar.get());
  }

  static const char* architectures() {
    if constexpr (requires { Impl::architectures; }) return Impl::architectures;
    return nullptr;
  }
  static const char* model_features() {
    if constexpr (requires { Impl::model_features; }) return Impl::model_features;
    return nullptr;
  }

  static const char* device_name() noexcept {
    thread_local std::string name;
    try {
      name = Impl::device_name();
    } catch (const std::exception& e) {
      name = std::string("unknown device (") + e.what() + ")";
    }
    return name.c_str();
  }

  static ts_status capabilities(ts_capabilities* out) noexcept {
    return abi::guard([&] {
      abi::require(out && out->struct_size >= TS_CAPABILITIES_V4_SIZE,
                   "capabilities: null or struct_size too small");
      // A caller built against an older header passes a smaller struct: fill
      // only the part it has (ABI v5 appended top_n) and say how much.
      ts_capabilities c{};
      Impl::capabilities(c);
      if constexpr (kGreedy) c.flags |= TS_CAP_DEVICE_GREEDY;
      // ABI v6: the flags say what the table holds.
      if constexpr (kFork)
        c.flags |= TS_CAP_KV_PREFIX_COPY;
      else
        c.flags &= ~TS_CAP_KV_PREFIX_COPY;
      if constexpr (!kStepBatch) c.flags &= ~TS_CAP_BATCHED_SESSIONS;
      if constexpr (kGrammar)
        c.flags |= TS_CAP_STRUCTURED_OUTPUT;
      else
        c.flags &= ~TS_CAP_STRUCTURED_OUTPUT;
      // ABI v8: likewise.
      c.flags &= ~(TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL);
      if constexpr (kEmbeddings) c.flags |= TS_CAP_EMBEDDING_INPUT;
      if constexpr (kVision) c.flags |= TS_CAP_MULTIMODAL;
      const size_t n = std::min<size_t>(out->struct_size, sizeof(ts_capabilities));
      c.struct_size = uint32_t(n);
      std::memcpy(out, &c, n);
    });
  }

  static ts_status load_model(const char* path, ts_model** out) noexcept {
    return abi::guard([&] {
      abi::require(path && out, "load_model: null argument");
      *out = nullptr;
      auto b = std::make_unique<ModelBox>();
      b->model = Impl::load_model(path);
      b->n_vocab = b->model->n_vocab();
      *out = reinterpret_cast<ts_model*>(b.release());
    });
  }

  static void free_model(ts_model* m) noexcept { delete box(m); }
  static int32_t n_vocab(const ts_model* m) noexcept { return m ? box(m)->n_vocab : 0; }

  static ts_status open_session(ts_model* m, const ts_session_options* o,
                                ts_session** out) noexcept {
    return abi::guard([&] {
      abi::require(m && o && out, "open_session: null argument");
      *out = nullptr;
      abi::require(o->struct_size >= sizeof(ts_session_options),
                   "open_session: struct_size too small");
      // Read as an integer: a C caller may pass a value no enumerator names,
      // and loading that through the C++ enum type is undefined behaviour.
      int weight_path = 0;
      static_assert(sizeof weight_path == sizeof o->weight_path);
      std::memcpy(&weight_path, &o->weight_path, sizeof weight_path);
      abi::require(weight_path == TS_WEIGHTS_FULL_PRECISION || weight_path == TS_WEIGHTS_QUANTIZED,
                   "open_session: unknown weight path");
      abi::require(o->n_threads >= 0 && o->max_context >= 0,
                   "open_session: negative n_threads or max_context");
      auto b = std::make_unique<SessionBox>();
      b->session = Impl::open_session(*box(m)->model, *o);
      b->n_vocab = box(m)->n_vocab;
      b->model = box(m);
      b->weight_path = weight_path;
      *out = reinterpret_cast<ts_session*>(b.release());
    });
  }

  static ts_status fork_session(ts_session* src, int32_t n_prefix, ts_session** out) noexcept {
    return abi::guard([&] {
      abi::require(src && out, "fork_session: null argument");
      *out = nullptr;
      if constexpr (kFork) {
        const SessionBox& from = *box(src);
        const int32_t position = from.session->position();
        if (n_prefix < 0 || n_prefix > position) {
          throw abi::StatusError(TS_ERR_INVALID_ARGUMENT,
                                 "fork_session: n_prefix " + std::to_string(n_prefix) +
                                     " outside [0, " + std::to_string(position) + "]");
        }
        auto b = std::make_unique<SessionBox>();
        b->session = from.session->fork(n_prefix);
        if (from.grammar && n_prefix >= from.grammar_start) {
          b->grammar = from.grammar->clone();
          b->grammar->rollback(position - n_prefix);
          b->grammar_start = from.grammar_start;
          grammar_changed(*b);
        }
        b->n_vocab = from.n_vocab;
        b->model = from.model;
        b->weight_path = from.weight_path;
        if (!b->session || b->session->position() != n_prefix) {
          throw abi::StatusError(TS_ERR_INTERNAL,
                                 "fork_session: the forked session does not hold n_prefix = " +
                                     std::to_string(n_prefix) + " positions");
        }
        *out = reinterpret_cast<ts_session*>(b.release());
      }
    });
  }

  static const ts_batch_entry& entry(const ts_batch_entry* e, int32_t i) {
    return *reinterpret_cast<const ts_batch_entry*>(reinterpret_cast<const char*>(e) +
                                                    size_t(i) * e->struct_size);
  }

  // Every check of step_batch before the backend sees an entry; messages name
  // the entry ("step_batch: entry 3: token #0 = -1 outside [0, 49152)").
  static std::vector<abi::BatchItem<Session>> batch_items(const ts_batch_entry* e, int32_t n) {
    abi::require(e != nullptr && n >= 1, "step_batch: null entries or n_entries < 1");
    const uint32_t stride = e->struct_size;
    abi::require(stride >= sizeof(ts_batch_entry), "step_batch: entry 0: struct_size too small");
    ts_capabilities caps{};
    caps.struct_size = sizeof caps;
    Impl::capabilities(caps);
    if (caps.max_batch > 0 && n > caps.max_batch) {
      throw abi::StatusError(TS_ERR_INVALID_ARGUMENT, "step_batch: " + std::to_string(n) +
                                                          " entries, max_batch is " +
                                                          std::to_string(caps.max_batch));
    }
    std::vector<abi::BatchItem<Session>> items;
    const SessionBox* first = nullptr;
    for (int32_t i = 0; i < n; ++i) {
      const ts_batch_entry& entry = BackendAdapter::entry(e, i);
      const std::string at = "step_batch: entry " + std::to_string(i) + ": ";
      try {
        abi::require(entry.struct_size == stride, "struct_size differs from entry 0's");
        abi::require(entry.session != nullptr, "null session");
        const SessionBox* b = box(entry.session);
        if (!first) first = b;
        abi::require(b->model == first->model, "a session of another model than entry 0's");
        abi::require(b->weight_path == first->weight_path,
                     "a session of another weight path than entry 0's");
        for (const auto& item : items)
          abi::require(item.session != b->session.get(), "the same session twice in one call");
        abi::require(!entry.all_positions || (caps.flags & TS_CAP_ALL_POSITION_LOGITS),
                     "all_positions without TS_CAP_ALL_POSITION_LOGITS");
        Session& s =
            appendable(entry.session, entry.tokens, entry.n_tokens, entry.logits_out, "prefill");
        items.push_back({&s, std::span<const int32_t>(entry.tokens, size_t(entry.n_tokens)),
                         entry.all_positions != 0, entry.logits_out});
      } catch (const abi::StatusError& err) {
        throw abi::StatusError(err.status(), at + err.what());
      }
    }
    return items;
  }

  static ts_status step_batch(const ts_batch_entry* e, int32_t n) noexcept {
    return abi::guard([&] {
      if constexpr (kStepBatch) {
        const std::vector<abi::BatchItem<Session>> items = batch_items(e, n);
        std::vector<SessionBox*> boxes;
        for (int32_t i = 0; i < n; ++i) boxes.push_back(box(entry(e, i).session));
        size_t accepted = 0;  // entries whose tokens the grammars took
        std::vector<int32_t> before;
        for (const auto& item : items) before.push_back(item.session->position());
        try {
          for (; accepted < items.size(); ++accepted) {
            grammar_accept(*boxes[accepted], items[accepted].tokens,
                           "step_batch: entry " + std::to_string(accepted));
          }
          Impl::step_batch(std::span<const abi::BatchItem<Session>>(items));
        } catch (...) {
          // No session changes position (nor grammar state) on an error.
          for (size_t i = 0; i < items.size(); ++i) {
            if (items[i].session->position() > before[i]) items[i].session->rewind(before[i]);
            if (i < accepted) grammar_undo(*boxes[i], items[i].tokens.size());
          }
          throw;
        }
        for (size_t i = 0; i < items.size(); ++i)
          keep_rows(*boxes[i], items[i].logits, items[i].tokens.size(), items[i].all_positions);
      }
    });
  }

  static void free_session(ts_session* s) noexcept { delete box(s); }

  // The checks every appending call makes before the backend sees the tokens.
  static Session& appendable(ts_session* s, const int32_t* tokens, int32_t n, const void* out,
                             const char* fn) {
    if (!s || !tokens || !out || n <= 0)
      throw abi::StatusError(TS_ERR_INVALID_ARGUMENT,
                             std::string(fn) + ": null buffer or n_tokens <= 0");
    Session& session = *box(s)->session;
    abi::check_tokens(tokens, n, box(s)->n_vocab);
    abi::check_room(session.position(), n, session.max_context());
    return session;
  }

  // ---- ABI v7: the grammar kept in step with the calls ----

  // The tokens through the session's grammar (if any) before the backend computes
  // them; on a refusal the ones already taken are undone and the call fails.
  static void grammar_accept(SessionBox& b, std::span<const int32_t> tokens,
                             const std::string& fn) {
    if (!b.grammar) return;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (!b.grammar->accept(tokens[i])) {
        b.grammar->rollback(int32_t(i));
        throw abi::StatusError(TS_ERR_INVALID_ARGUMENT,
                               fn + ": token #" + std::to_string(i) + " = " +
                                   std::to_string(tokens[i]) +
                                   " is not allowed by the grammar at position " +
                                   std::to_string(b.session->position() + int64_t(i)));
      }
    }
  }
  static void grammar_undo(SessionBox& b, size_t n) {
    if (b.grammar) b.grammar->rollback(int32_t(n));
  }
  // Keeps the call's logits for grammar_greedy: every row while a grammar is set
  // and the call returned all positions, else the last row.
  static void keep_rows(SessionBox& b, const float* logits, size_t n_tokens, bool all) {
    if constexpr (kGrammar) {
      const size_t rows = all ? n_tokens : 1;
      const size_t kept = (all && b.grammar) ? rows : 1;
      const float* from = logits + (rows - kept) * size_t(b.n_vocab);
      b.last_rows.assign(from, from + kept * size_t(b.n_vocab));
      b.n_last_rows = int32_t(kept);
    }
  }
  // Runs the backend's appending call with the grammar taken first and undone
  // if the backend throws.
  template <class F>
  static void appending(SessionBox& b, std::span<const int32_t> tokens, const char* fn, F&& call) {
    grammar_accept(b, tokens, fn);
    try {
      call();
    } catch (...) {
      grammar_undo(b, tokens.size());
      throw;
    }
  }

  static ts_status prefill(ts_session* s, const int32_t* tokens, int32_t n, int32_t all,
                           float* logits) noexcept {
    return abi::guard([&] {
      Session& session = appendable(s, tokens, n, logits, "prefill");
      const std::span<const int32_t> t(tokens, size_t(n));
      appending(*box(s), t, "prefill", [&] { session.prefill(t, all != 0, logits); });
      keep_rows(*box(s), logits, size_t(n), all != 0);
    });
  }

  static ts_status decode(ts_session* s, int32_t token, float* logits) noexcept {
    return abi::guard([&] {
      Session& session = appendable(s, &token, 1, logits, "decode");
      appending(*box(s), std::span<const int32_t>(&token, 1), "decode", [&] {
        if constexpr (kDecode) {
          session.decode(token, logits);
        } else {
          session.prefill(std::span<const int32_t>(&token, 1), false, logits);
        }
      });
      keep_rows(*box(s), logits, 1, false);
    });
  }

  static ts_status prefill_greedy(ts_session* s, const int32_t* tokens, int32_t n,
                                  int32_t* token_out) noexcept {
    return abi::guard([&] {
      if constexpr (kGreedy) {
        Session& session = appendable(s, tokens, n, token_out, "prefill_greedy");
        const std::span<const int32_t> t(tokens, size_t(n));
        appending(*box(s), t, "prefill_greedy", [&] { *token_out = session.prefill_greedy(t); });
        box(s)->n_last_rows = 0;  // no logits came back to the adapter
      }
    });
  }

  static ts_status rewind(ts_session* s, int32_t position) noexcept {
    return abi::guard([&] {
      abi::require(s != nullptr, "rewind: null session");
      SessionBox& b = *box(s);
      Session& session = *b.session;
      abi::check_rewind(position, session.position());
      const int32_t from = session.position();
      session.rewind(position);
      b.n_last_rows = 0;
      if (!b.grammar) return;
      if (position >= b.grammar_start)
        b.grammar->rollback(from - position);
      else {
        b.grammar.reset();  // rewound past where the grammar was set: removed
        grammar_changed(b);
      }
    });
  }

  static ts_status set_grammar(ts_session* s, const ts_grammar* g) noexcept {
    return abi::guard([&] {
      abi::require(s != nullptr, "set_grammar: null session");
      SessionBox& b = *box(s);
      if (!g) {
        b.grammar.reset();
        grammar_changed(b);
        return;
      }
      abi::require(g->struct_size >= sizeof(ts_grammar) && g->text != nullptr,
                   "set_grammar: null text or struct_size too small");
      int kind = 0;
      static_assert(sizeof kind == sizeof g->kind);
      std::memcpy(&kind, &g->kind, sizeof kind);
      abi::require(kind >= TS_GRAMMAR_JSON_SCHEMA && kind <= TS_GRAMMAR_REGEX,
                   "set_grammar: unknown grammar kind");
      if constexpr (kGrammar) {
        b.grammar = b.session->compile_grammar(*g);
        b.grammar_start = b.session->position();
        grammar_changed(b);
      }
    });
  }

  static SessionBox& with_grammar(ts_session* s, const char* fn) {
    if (!s || !box(s)->grammar)
      throw abi::StatusError(TS_ERR_INVALID_ARGUMENT,
                             std::string(fn) + ": no grammar set on the session");
    return *box(s);
  }

  static ts_status grammar_mask(ts_session* s, uint32_t* out, int32_t n_words) noexcept {
    return abi::guard([&] {
      SessionBox& b = with_grammar(s, "grammar_mask");
      abi::require(out != nullptr && n_words == TS_MASK_WORDS(b.n_vocab),
                   "grammar_mask: null buffer or n_words != TS_MASK_WORDS(n_vocab)");
      b.grammar->mask(out, n_words);
    });
  }

  static ts_status grammar_greedy(ts_session* s, int32_t n, int32_t* out) noexcept {
    return abi::guard([&] {
      SessionBox& b = with_grammar(s, "grammar_greedy");
      abi::require(out != nullptr && n >= 1, "grammar_greedy: null buffer or n_positions < 1");
      if (n > b.n_last_rows) {
        throw abi::StatusError(TS_ERR_INVALID_ARGUMENT,
                               "grammar_greedy: " + std::to_string(n) + " positions asked, the " +
                                   "last call left " + std::to_string(b.n_last_rows) +
                                   " logits rows (all positions need a grammar set before it)");
      }
      const int32_t accepted = b.session->position() - b.grammar_start;
      abi::require(n - 1 <= accepted, "grammar_greedy: a position before the grammar was set");
      std::vector<uint32_t> mask(size_t(TS_MASK_WORDS(b.n_vocab)));
      for (int32_t i = 0; i < n; ++i) {
        const int32_t back = n - 1 - i;  // tokens after the row's position
        std::unique_ptr<abi::GrammarState> state = b.grammar->clone();
        state->rollback(back);
        state->mask(mask.data(), int32_t(mask.size()));
        const int32_t row = b.n_last_rows - 1 - back;
        out[i] = abi::masked_argmax(b.last_rows.data() + size_t(row) * size_t(b.n_vocab), b.n_vocab,
                                    mask.data());
      }
    });
  }

  // ---- ABI v8: multimodal ----

  static ts_status prefill_embeddings(ts_session* s, const ts_embedding_input* in, int32_t all,
                                      float* logits) noexcept {
    return abi::guard([&] {
      if constexpr (kEmbeddings) {
        abi::require(s && in && logits, "prefill_embeddings: null argument");
        abi::require(in->struct_size >= sizeof(ts_embedding_input) && in->embeddings,
                     "prefill_embeddings: null embeddings or struct_size too small");
        abi::require(in->n_tokens >= 1, "prefill_embeddings: n_tokens < 1");
        SessionBox& b = *box(s);
        Session& session = *b.session;
        if (in->n_embd != session.n_embd()) {
          throw abi::StatusError(TS_ERR_INVALID_ARGUMENT,
                                 "prefill_embeddings: n_embd " + std::to_string(in->n_embd) +
                                     " is not the model's embedding width " +
                                     std::to_string(session.n_embd()));
        }
        abi::require(!b.grammar,
                     "prefill_embeddings: a grammar is set on the session (grammars constrain "
                     "tokens; set it after the embeddings)");
        abi::check_room(session.position(), in->n_tokens, session.max_context());
        session.prefill_embeddings(in->embeddings, in->n_tokens, in->bidirectional != 0, all != 0,
                                   logits);
        b.n_last_rows = 0;  // no token rows for grammar_greedy
      }
    });
  }

  static ts_status load_vision(ts_model* m, const char* path) noexcept {
    return abi::guard([&] {
      abi::require(m && path, "load_vision: null argument");
      if constexpr (kVision) box(m)->model->load_vision(std::string(path));
    });
  }

  static ts_status encode_image(ts_model* m, const ts_image* img, float* out,
                                int64_t n_floats) noexcept {
    return abi::guard([&] {
      abi::require(m && img && out, "encode_image: null argument");
      abi::require(img->struct_size >= sizeof(ts_image) && img->data,
                   "encode_image: null data or struct_size too small");
      int format = 0;
      static_assert(sizeof format == sizeof img->format);
      std::memcpy(&format, &img->format, sizeof format);
      abi::require(format == TS_IMAGE_PIXELS_F32 || format == TS_IMAGE_RGB8,
                   "encode_image: unknown image format");
      abi::require(img->channels == 3 && img->height > 0 && img->width > 0,
                   "encode_image: the image must have 3 channels, height and width > 0");
      abi::require(n_floats > 0, "encode_image: n_floats <= 0");
      if constexpr (kVision) box(m)->model->encode_image(*img, out, n_floats);
    });
  }

  static ts_status preprocess_image(ts_model* m, const ts_image* img, ts_pixel_shape* shape,
                                    float* out, int64_t n_floats) noexcept {
    return abi::guard([&] {
      abi::require(m && img && shape, "preprocess_image: null argument");
      abi::require(img->struct_size >= sizeof(ts_image) && img->data,
                   "preprocess_image: null data or struct_size too small");
      abi::require(shape->struct_size >= sizeof(ts_pixel_shape),
                   "preprocess_image: shape_out's struct_size too small");
      int format = 0;
      static_assert(sizeof format == sizeof img->format);
      std::memcpy(&format, &img->format, sizeof format);
      abi::require(format == TS_IMAGE_RGB8, "preprocess_image: the image must be TS_IMAGE_RGB8");
      abi::require(img->channels == 3 && img->height > 0 && img->width > 0,
                   "preprocess_image: the image must have 3 channels, height and width > 0");
      abi::require(!out || n_floats > 0, "preprocess_image: n_floats <= 0");
      if constexpr (kPreprocess) {
        const ts_pixel_shape got = box(m)->model->preprocess_image(*img, out, n_floats);
        shape->n_frames = got.n_frames;
        shape->channels = got.channels;
        shape->height = got.height;
        shape->width = got.width;
      }
    });
  }

  static ts_status set_vision_options(ts_model* m, const ts_vision_options* o) noexcept {
    return abi::guard([&] {
      abi::require(m != nullptr, "set_vision_options: null model");
      abi::require(!o || o->struct_size >= sizeof(ts_vision_options),
                   "set_vision_options: struct_size too small");
      if constexpr (kVisionOptions)
        box(m)->model->set_vision_fault(o && o->fault ? std::string(o->fault) : std::string());
    });
  }

  static int32_t position(const ts_session* s) noexcept {
    return s ? box(s)->session->position() : 0;
  }

  static ts_status set_taps(ts_session* s, int32_t enable) noexcept {
    return abi::guard([&] {
      abi::require(s != nullptr, "set_taps: null session");
      if constexpr (kTaps) box(s)->session->set_taps(enable != 0);
    });
  }

  static ts_status read_taps(ts_session* s, float* out, int64_t n) noexcept {
    return abi::guard([&] {
      abi::require(s != nullptr && out != nullptr, "read_taps: null argument");
      if constexpr (kTaps) box(s)->session->read_taps(out, n);
    });
  }

 public:
  static const ts_backend* table() noexcept {
    static const ts_backend t = {
        TS_BACKEND_API_VERSION,
        Impl::name,
        Impl::version,
        abi::last_error,
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
        kGreedy ? prefill_greedy : nullptr,
        architectures(),
        model_features(),
        kTaps ? set_taps : nullptr,
        kTaps ? read_taps : nullptr,
        kStepBatch ? step_batch : nullptr,
        kFork ? fork_session : nullptr,
        kGrammar ? set_grammar : nullptr,
        kGrammar ? grammar_mask : nullptr,
        kGrammar ? grammar_greedy : nullptr,
        kEmbeddings ? prefill_embeddings : nullptr,
        kVision ? load_vision : nullptr,
        kVision ? encode_image : nullptr,
        kPreprocess ? preprocess_image : nullptr,
        kVisionOptions ? set_vision_options : nullptr,
    };
    return &t;
  }
};

}  // namespace touchstone

// Exports the one symbol the harness looks up (TS_BACKEND_ENTRY_SYMBOL).
#define TOUCHSTONE_BACKEND_ENTRY(Impl)                                                          \
  extern "C" __attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry( \
      void) {                                                                                   \
    return ::touchstone::BackendAdapter<Impl>::table();                                         \
  }
