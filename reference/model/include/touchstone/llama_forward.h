// touchstone/llama_forward.h - former name of the reference forward pass; the class
// now computes every supported family (touchstone/reference_forward.h).
#pragma once

#include "touchstone/reference_forward.h"

namespace touchstone {
using LlamaReference = ReferenceTransformer;
}  // namespace touchstone
