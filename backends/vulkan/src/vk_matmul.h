// vk_matmul.h - Y (+)= W X for a weight matrix in row parts (vk_weights.h): one
// record_matmul (vk_kernels.h) per part, each writing its rows' columns of Y.
#pragma once

#include "vk_kernels.h"
#include "vk_weights.h"

namespace touchstone::vk {

// W's parts: part rows [row0, row0 + n_rows) write Y's columns from p.y_off + row0
// (p.n_out: ignored, each part's rows).
inline void record_matmul(Recorder& r, const Kernels& k, const DeviceMatrix& W, const Buffer& x,
                          const Buffer& y, MatmulPush p) {
  const uint32_t y_off = p.y_off;
  for (const MatrixPart& part : W.parts) {
    p.n_out = part.n_rows;
    p.y_off = y_off + part.row0;
    record_matmul(r, k, W.type, part.buf, x, y, p);
  }
}

// The same for expert e of E: its parts' ranges of E's slabs.
inline void record_matmul(Recorder& r, const Kernels& k, const DeviceExperts& E, size_t e,
                          const Buffer& x, const Buffer& y, MatmulPush p) {
  const uint32_t y_off = p.y_off;
  for (const ExpertPart& part : E.experts[e]) {
    p.n_out = part.n_rows;
    p.y_off = y_off + part.row0;
    record_matmul(r, k, E.type, E.range(part), x, y, p);
  }
}

}  // namespace touchstone::vk
