// touchstone/model/session_fault.h - the fault a backend session was opened
// with (ts_session_options.fault), for the in-tree backends.
#pragma once

#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/common/error.h"
#include "touchstone/model/faults.h"

namespace touchstone::abi {

// The catalog entry named by `name` (NULL or "" = no fault). An unknown name
// is TS_ERR_UNSUPPORTED naming it and the catalog (parse_fault's message);
// whether the backend implements the fault is the backend's own check.
inline touchstone::Faults session_fault(const char* name) {
  try {
    return touchstone::parse_fault(name ? name : "");
  } catch (const touchstone::Error& e) {
    throw StatusError(TS_ERR_UNSUPPORTED, e.what());
  }
}

}  // namespace touchstone::abi
