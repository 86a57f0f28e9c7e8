// weight_matrix.cpp - rows of a GGUF tensor read in place; see touchstone/model/weight_matrix.h.
#include "touchstone/model/weight_matrix.h"

#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"

namespace touchstone {

WeightMatrix::WeightMatrix(gguf::TensorType type, const uint8_t* data, int64_t n_out, int64_t n_in)
    : type_(type), data_(data), n_out_(n_out), n_in_(n_in) {
  const gguf::TypeTraits& t = gguf::type_traits(type);
  if (n_out < 0 || n_in <= 0 || n_in % int64_t{t.block_size} != 0) {
    throw Error("weight matrix of {} x {} {}: the row length is not a whole number of blocks",
                n_out, n_in, t.name);
  }
  if (!gguf::can_dequantize(type)) {
    throw Error("weight matrix of type {}: no dequantizer for this type", t.name);
  }
  row_bytes_ = size_t(n_in / int64_t{t.block_size}) * size_t{t.type_size};
}

const float* WeightMatrix::row(int64_t o, float* scratch) const {
  const uint8_t* src = data_ + size_t(o) * row_bytes_;
  if (type_ == gguf::TensorType::F32) return reinterpret_cast<const float*>(src);
  gguf::dequantize_row(type_, src, scratch, n_in_);
  return scratch;
}

WeightMatrix WeightMatrix::slice(int64_t begin, int64_t n) const {
  if (begin < 0 || n < 0 || begin + n > n_out_) {
    throw Error("weight matrix rows [{}, {}) outside [0, {})", begin, begin + n, n_out_);
  }
  WeightMatrix out = *this;
  out.data_ = data_ + size_t(begin) * row_bytes_;
  out.n_out_ = n;
  return out;
}

std::vector<float> WeightMatrix::dequantize() const {
  std::vector<float> out(size_t(n_out_) * size_t(n_in_));
  if (!out.empty()) gguf::dequantize_row(type_, data_, out.data(), n_out_ * n_in_);
  return out;
}

WeightMatrix WeightMatrix::expanded() const {
  if (empty()) return *this;
  auto values = std::make_shared<const std::vector<float>>(dequantize());
  WeightMatrix out(gguf::TensorType::F32, reinterpret_cast<const uint8_t*>(values->data()), n_out_,
                   n_in_);
  out.owned_ = std::move(values);
  return out;
}

}  // namespace touchstone
