// kernels_quant_r16k.h - the K-quant (Q4_K, Q6_K) part of the row-interleaved
// int8 kernel (kernels_quant_r16k.cpp); kernels.h's r16_type / r16_bytes /
// repack_r16 / gemm_q_r16 call these for ggml types 12 and 14. nb counts
// 32-element blocks (n_in / 32, a multiple of 8: whole 256-element super-blocks).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace touchstone::cpu_simd {

bool r16k_type(int ggml_type);
size_t r16k_bytes(int ggml_type, size_t n_rows, size_t nb);
void repack_r16k(int ggml_type, const uint8_t* W, size_t row_bytes, size_t nb, size_t n_rows,
                 uint8_t* dst);
void gemm_q_r16k(int ggml_type, const uint8_t* R, size_t nb, size_t r0, size_t r1, const ActRow* X,
                 size_t n_tok, float* Y, size_t ldy);

}  // namespace touchstone::cpu_simd
