// touchstone/model/session_fault.h - the fault a backend session was opened
// with (ts_session_options.fault), for the in-tree backends.
#pragma once

#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/common/error.h"
#include "touchstone/model/faults.h"

namespace touchstone::abi {

// The fault groups beyond the common ones that a backend implements.
struct FaultSupport {
  bool grammar = false;  // structured output: enforces grammars itself (ABI v7)
  bool moe = false;      // the mixture-of-experts router faults (Faults::moe)
  bool sinks = false;    // the attention-sink faults (Faults::sinks)
  // The image-input faults (Faults::multimodal), one by one:
  bool image_attention = false;  // image_attended_causally
  bool image_position = false;   // image_position_offset
  bool image_split = false;      // image_split_position_reset
};

// parse_fault, with an unknown name as TS_ERR_UNSUPPORTED naming it and the catalog.
inline touchstone::Faults catalog_fault(const std::string& name) {
  try {
    return touchstone::parse_fault(name);
  } catch (const touchstone::Error& e) {
    throw StatusError(TS_ERR_UNSUPPORTED, e.what());
  }
}

// The catalog entry named by `name` (NULL or "" = no fault). An unknown name
// is TS_ERR_UNSUPPORTED naming it and the catalog (parse_fault's message); so
// is a fault of a group the backend does not implement (`support`): a
// structured-output fault unless it enforces grammars itself, a mixture-of-experts
// fault or an attention-sink fault unless it implements those. Whether the backend
// implements any other fault is the backend's own check.
inline touchstone::Faults session_fault(const char* name, FaultSupport support = {}) {
  const touchstone::Faults f = catalog_fault(name ? name : "");
  if (f.grammar() && !support.grammar) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "fault '" + f.name +
                          "' sits in a grammar the backend enforces itself (ABI v7 "
                          "TS_CAP_STRUCTURED_OUTPUT); this backend enforces none");
  }
  if (f.moe() && !support.moe) {
    throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + f.name +
                                              "' is a mixture-of-experts routing fault, which "
                                              "this backend does not implement");
  }
  if (f.sinks() && !support.sinks) {
    throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + f.name +
                                              "' is an attention-sink fault, which this "
                                              "backend does not implement");
  }
  if (f.vision_path()) {
    throw StatusError(TS_ERR_UNSUPPORTED,
                      "fault '" + f.name +
                          "' sits in the vision path: it goes to set_vision_options (ABI v9), "
                          "not to a session");
  }
  if ((f.image_attended_causally && !support.image_attention) ||
      (f.image_position_offset && !support.image_position) ||
      (f.image_split_position_reset && !support.image_split)) {
    throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + f.name +
                                              "' is an image-input fault, which this backend "
                                              "does not implement");
  }
  return f;
}

// The fault for a backend's vision path (ts_vision_options.fault, ABI v9; "" = none): a
// vision-path fault of the catalog (Faults::vision_path), else TS_ERR_UNSUPPORTED naming it.
inline touchstone::Faults vision_fault(const std::string& name) {
  const touchstone::Faults f = catalog_fault(name);
  if (!name.empty() && !f.vision_path())
    throw StatusError(TS_ERR_UNSUPPORTED, "set_vision_options: fault '" + name +
                                              "' is not a vision-path fault (those go to a "
                                              "session)");
  return f;
}

}  // namespace touchstone::abi
