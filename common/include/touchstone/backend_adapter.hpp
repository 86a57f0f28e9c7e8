// touchstone/backend_adapter.hpp - write a Touchstone backend as a C++ class.
//
// The session contract is the C table in touchstone/backend_abi.h. This
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
//     };
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

#include "touchstone/backend_abi.h"

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
      *out = reinterpret_cast<ts_session*>(b.release());
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

  static ts_status prefill(ts_session* s, const int32_t* tokens, int32_t n, int32_t all,
                           float* logits) noexcept {
    return abi::guard([&] {
      appendable(s, tokens, n, logits, "prefill")
          .prefill(std::span<const int32_t>(tokens, size_t(n)), all != 0, logits);
    });
  }

  static ts_status decode(ts_session* s, int32_t token, float* logits) noexcept {
    return abi::guard([&] {
      Session& session = appendable(s, &token, 1, logits, "decode");
      if constexpr (kDecode) {
        session.decode(token, logits);
      } else {
        session.prefill(std::span<const int32_t>(&token, 1), false, logits);
      }
    });
  }

  static ts_status prefill_greedy(ts_session* s, const int32_t* tokens, int32_t n,
                                  int32_t* token_out) noexcept {
    return abi::guard([&] {
      if constexpr (kGreedy) {
        *token_out = appendable(s, tokens, n, token_out, "prefill_greedy")
                         .prefill_greedy(std::span<const int32_t>(tokens, size_t(n)));
      }
    });
  }

  static ts_status rewind(ts_session* s, int32_t position) noexcept {
    return abi::guard([&] {
      abi::require(s != nullptr, "rewind: null session");
      Session& session = *box(s)->session;
      abi::check_rewind(position, session.position());
      session.rewind(position);
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
