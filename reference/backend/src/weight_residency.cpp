// weight_residency.cpp - see weight_residency.h.
#include "weight_residency.h"

#include <cstdlib>
#include <string>

#include "touchstone/common/error.h"

namespace touchstone::reference_backend {

Residency residency_for(uint64_t fp32_bytes) {
  const char* env = std::getenv("TOUCHSTONE_REFERENCE_WEIGHTS");
  const std::string v = env ? env : "auto";
  if (v == "stored") return Residency::kStored;
  if (v == "fp32") return Residency::kFp32;
  if (v == "auto") return fp32_bytes <= kAutoFp32Bytes ? Residency::kFp32 : Residency::kStored;
  throw Error("TOUCHSTONE_REFERENCE_WEIGHTS='{}': expected 'stored', 'fp32' or 'auto'", v);
}

}  // namespace touchstone::reference_backend
