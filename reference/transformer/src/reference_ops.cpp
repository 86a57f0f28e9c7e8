// reference_ops.cpp - matvec and add_into of the reference; see reference_ops.h.
#include "reference_ops.h"

#include <vector>

#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"

namespace touchstone::reference_ops {
namespace {

// The dot product of the thread_order_reduction fault: n split into one slice per
// thread of the pool, each slice's sum rounded to fp32 and the slices added in
// thread order, so the result depends on the thread count.
double dot_per_thread(const float* a, const float* b, int64_t n, int n_threads) {
  float acc = 0.0f;
  for (int k = 0; k < n_threads; ++k) {
    const int64_t i0 = n * k / n_threads, i1 = n * (k + 1) / n_threads;
    acc += static_cast<float>(ops::dot(a + i0, b + i0, i1 - i0));
  }
  return acc;
}

}  // namespace

void matvec(RowPool& pool, const WeightMatrix& W, const float* x, float* y, const Faults& f,
            const float* bias) {
  const int64_t n_in = W.cols();
  pool.run(W.rows(), [&](int64_t begin, int64_t end) {
    // One dequantized row at a time (a row of an 8B model's LM head is 16 KiB).
    thread_local std::vector<float> scratch;
    if (scratch.size() < size_t(n_in)) scratch.resize(size_t(n_in));
    for (int64_t o = begin; o < end; ++o) {
      const float* w = W.row(o, scratch.data());
      const double acc = f.thread_order_reduction    ? dot_per_thread(w, x, n_in, pool.size())
                         : f.session_order_reduction ? dot_per_thread(w, x, n_in, f.session_slices)
                         : f.batch_slices > 0        ? dot_per_thread(w, x, n_in, f.batch_slices)
                                                     : ops::dot(w, x, n_in);
      y[o] = static_cast<float>(bias ? acc + double{bias[o]} : acc);
      if (f.fp16_accumulation) y[o] = gguf::fp16_to_fp32(gguf::fp32_to_fp16(y[o]));
    }
  });
}

void add_into(std::vector<float>& x, const std::vector<float>& y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = static_cast<float>(double{x[size_t(i)]} + double{y[size_t(i)]});
}

}  // namespace touchstone::reference_ops
