// touchstone/backend_impl.h - in-tree helpers for implementing the C ABI.
//
// The shared argument checks, guard() and touchstone::BackendAdapter<Impl> live
// in the installed, standard-library-only touchstone/backend_adapter.hpp; this
// header adds what needs Touchstone's own libraries (touchstone::Error, the
// fault catalog).
#pragma once

#include <string>

#include "touchstone/backend_adapter.hpp"
#include "touchstone/error.h"

namespace touchstone::abi {

// Runs a model loader: UnsupportedModel (another family, a feature the backend
// lacks) becomes TS_ERR_UNSUPPORTED, any other touchstone::Error (a file it
// cannot read or parse) TS_ERR_IO, naming the file.
template <typename F>
auto load_or_status(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const StatusError&) {
    throw;
  } catch (const touchstone::UnsupportedModel& e) {
    throw StatusError(TS_ERR_UNSUPPORTED, e.what());
  } catch (const touchstone::Error& e) {
    throw StatusError(TS_ERR_IO, e.what());
  }
}

}  // namespace touchstone::abi
