// touchstone/model/session_fault.h - the fault a backend session was opened
// with (ts_session_options.fault), for the in-tree backends.
#pragma once

#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/common/error.h"
#include "touchstone/model/faults.h"

namespace touchstone::abi {

// The catalog entry named by `name` (NULL or "" = no fault). An unknown name
// is TS_ERR_UNSUPPORTED naming it and the catalog (parse_fault's message); so
// is a structured-output fault unless the backend enforces grammars itself
// (`enforces_grammar`, ABI v7), and a mixture-of-experts fault unless it implements
// those (`moe_faults`: the reference). Whether the backend implements any other
// fault is the backend's own check.
inline touchstone::Faults session_fault(const char* name, bool enforces_grammar = false,
                                        bool moe_faults = false) {
  touchstone::Faults f;
  try {
    f = touchstone::parse_fault(name ? name : "");
  } catch (const touchstone::Error& e) {
    throw StatusError(TS_ERR_UNSUPPORTED, e.what());
  }
  if (f.grammar() && !enforces_grammar) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "fault '" + f.name +
                          "' sits in a grammar the backend enforces itself (ABI v7 "
                          "TS_CAP_STRUCTURED_OUTPUT); this backend enforces none");
  }
  if (f.moe() && !moe_faults) {
    throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + f.name +
                                              "' is a mixture-of-experts routing fault, which "
                                              "only the reference implements");
  }
  return f;
}

}  // namespace touchstone::abi
