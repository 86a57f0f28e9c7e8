// touchstone/backend_impl.h - helpers for *implementing* the C ABI in C++.
//
// guard() runs a callable, turns any exception into a ts_status and stores the
// message for last_error(): exceptions never cross the ABI.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "touchstone/backend_abi.h"
#include "touchstone/error.h"

namespace touchstone::abi {

// Status an Error should map to, when thrown as StatusError.
class StatusError : public Error {
 public:
  StatusError(ts_status status, const std::string& what) : Error(what), status_(status) {}
  ts_status status() const { return status_; }

 private:
  ts_status status_;
};

inline std::string& last_error_storage() {
  thread_local std::string message;
  return message;
}

inline const char* last_error() { return last_error_storage().c_str(); }

// ---- argument checks every backend applies identically (same status, same message) ----

// TS_ERR_INVALID_ARGUMENT naming the index and value of the first token outside [0, n_vocab).
inline void check_tokens(const int32_t* tokens, int64_t n, int64_t n_vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      throw StatusError(TS_ERR_INVALID_ARGUMENT,
                        fmt::format("token #{} = {} outside [0, {})", i, tokens[i], n_vocab));
    }
  }
}

// TS_ERR_CONTEXT_FULL when appending n tokens at `position` would exceed max_context.
inline void check_room(int64_t position, int64_t n, int64_t max_context) {
  if (position + n > max_context) {
    throw StatusError(
        TS_ERR_CONTEXT_FULL,
        fmt::format("position {} + {} tokens exceeds max context {}", position, n, max_context));
  }
}

// TS_ERR_INVALID_ARGUMENT unless 0 <= to <= position.
inline void check_rewind(int64_t to, int64_t position) {
  if (to < 0 || to > position) {
    throw StatusError(TS_ERR_INVALID_ARGUMENT,
                      fmt::format("rewind to {} outside [0, {}]", to, position));
  }
}

// The greedy token of one logits row as prefill_greedy defines it: lowest id
// among equal maxima, NaN never wins (= the harness's metrics::argmax). For
// backends whose "device" is the host. Throws when every logit is NaN.
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
                      fmt::format("read_taps: n_floats {} != n_layer x {} x n_embd = {}", n,
                                  TS_TAP_POINTS, size));
  }
  std::copy(taps, taps + size, out);
}

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

}  // namespace touchstone::abi
