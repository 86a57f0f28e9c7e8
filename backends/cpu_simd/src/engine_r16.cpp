// engine_r16.cpp - the quantized weights a second time, row-interleaved for the
// int8 activation mode's AVX-512 VNNI kernel (kernels_quant_r16.cpp,
// kernels_quant_r16k.cpp): every Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K matrix
// whose rows are a multiple of 16.
#include <sys/mman.h>

#include <cstdlib>
#include <vector>

#include "engine.h"

namespace touchstone::cpu_simd {

const WeightSet& SimdModel::quantized_r16() {
  const WeightSet& q = quantized();  // throws when the quantized path is unavailable
  std::call_once(r16_once_, [&] {
    r16_ = q;
    std::vector<Linear*> all;
    for (LayerView& L : r16_.layers)
      for (Linear* w : L.matrices()) all.push_back(w);  // experts: one matrix each
    all.push_back(&r16_.lm_head);
    auto type = [](const Linear* w) { return w->generic ? w->gtype : int(w->qtype); };
    std::erase_if(all, [&](const Linear* w) {
      return !w->q || !r16_type(type(w)) || w->n_out % 16 != 0 || w->n_in % 32 != 0 ||
             (w->generic && w->n_in % w->block_elems != 0);
    });
    constexpr size_t kAlign = size_t{2} << 20;
    size_t total = 0;
    for (const Linear* w : all) total += (r16_bytes(type(w), w->n_out, w->n_in / 32) + 63) & ~63ul;
    total = (total + kAlign - 1) & ~(kAlign - 1);
    if (total == 0) return;
    uint8_t* base = static_cast<uint8_t*>(std::aligned_alloc(kAlign, total));
    if (!base) return;  // the int8 path keeps the GGUF layout's kernel
    r16_arena_.reset(base);
    madvise(base, total, MADV_HUGEPAGE);
    size_t off = 0;
    for (Linear* w : all) {
      const size_t nb = w->n_in / 32;
      repack_r16(type(w), w->q, w->row_bytes, nb, w->n_out, base + off);
      w->r16 = base + off;
      off += (r16_bytes(type(w), w->n_out, nb) + 63) & ~63ul;
    }
  });
  return r16_;
}

}  // namespace touchstone::cpu_simd
