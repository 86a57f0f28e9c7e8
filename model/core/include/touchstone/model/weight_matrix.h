// touchstone/model/weight_matrix.h - a weight matrix read in place from its GGUF file.
//
// The rows of a 2-D GGUF tensor (ggml shape {n_in, n_out}: ne[0] = n_in contiguous)
// are n_out runs of n_in / block_size blocks of `type`, row o starting at byte
// o * row_bytes(). A WeightMatrix points at those bytes inside a gguf::File (which
// must outlive it; StoredWeights keeps its File alive) and dequantizes one row when
// asked, with the reference dequantizer (gguf::dequantize_row, ggml's formulas bit for
// bit). Every value it gives is the value the whole-tensor gguf::dequantize() gives at
// the same index, so code that reads rows through it computes what it computed with a
// dequantized copy, with resident memory of the file's size instead of 4 bytes per weight.
//
// An F32 matrix hands out pointers into the file's bytes (no copy; expanded() makes an F32
// matrix of any type, owning its values); the file's buffer is
// page-aligned and tensor offsets are multiples of general.alignment, so they are
// float-aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "touchstone/model/gguf.h"

namespace touchstone {

class WeightMatrix {
 public:
  WeightMatrix() = default;
  // n_out rows of n_in elements of `type` at `data` (n_in a multiple of the type's
  // block size, else touchstone::Error). The bytes are not copied.
  WeightMatrix(gguf::TensorType type, const uint8_t* data, int64_t n_out, int64_t n_in);

  gguf::TensorType type() const { return type_; }
  int64_t rows() const { return n_out_; }
  int64_t cols() const { return n_in_; }
  bool empty() const { return n_out_ == 0; }
  size_t row_bytes() const { return row_bytes_; }
  const uint8_t* data() const { return data_; }

  // Row o (0 <= o < rows(), unchecked) as n_in floats: a pointer into the file for F32,
  // else `scratch` (n_in floats, written) holding the row dequantized.
  const float* row(int64_t o, float* scratch) const;
  // Rows [begin, begin + n) as a matrix of their own (a fused tensor's part, one expert
  // of a 3-D tensor). Throws touchstone::Error when the range is outside [0, rows()).
  WeightMatrix slice(int64_t begin, int64_t n) const;
  // Every row dequantized, row-major [rows()][cols()] (for tests and small matrices).
  std::vector<float> dequantize() const;
  // An F32 matrix of the same values that owns them (dequantize()d once; 4 bytes per
  // weight, no longer pointing into the file): the fast form for a model whose fp32
  // weights fit in memory. Slices of the result share its buffer.
  WeightMatrix expanded() const;

 private:
  gguf::TensorType type_ = gguf::TensorType::F32;
  const uint8_t* data_ = nullptr;
  int64_t n_out_ = 0, n_in_ = 0;
  size_t row_bytes_ = 0;
  std::shared_ptr<const std::vector<float>> owned_;  // expanded(): the values, else null
};

}  // namespace touchstone
