// touchstone/backend_impl.h - helpers for *implementing* the C ABI in C++.
//
// guard() runs a callable, turns any exception into a ts_status and stores the
// message for last_error(): exceptions never cross the ABI.
#pragma once

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
