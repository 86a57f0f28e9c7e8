// weight_residency.h (internal to the reference backend) - whether a model's matrices stay
// as stored in its GGUF file or are expanded to fp32 at load (docs/reference.md "Weight
// residency"). Either way the logits are the same bits: only memory and speed differ.
#pragma once

#include <cstdint>

namespace touchstone::reference_backend {

enum class Residency { kStored, kFp32 };

// The automatic choice: fp32 when the matrices dequantized take at most this many bytes
// (SmolLM2-135M: 0.54 GB, Gemma 3 270M: 1.07 GB; an 8B model's 32 GB stays as stored).
inline constexpr uint64_t kAutoFp32Bytes = uint64_t{2} << 30;

// TOUCHSTONE_REFERENCE_WEIGHTS: "stored", "fp32", or "auto" / unset (fp32 when
// fp32_bytes <= kAutoFp32Bytes, else stored). Throws touchstone::Error naming the
// variable and its value for anything else.
Residency residency_for(uint64_t fp32_bytes);

}  // namespace touchstone::reference_backend
