// kquant_pack.cpp - Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K / MXFP4 blocks in the graph's layouts
// (kquant_pack.h).
// Block formats: ggml-common.h; the values follow model/gguf/src/quant.cpp
// (deq_q5_0, deq_q5_1, deq_q4_K, deq_q5_K, deq_q6_K, deq_mxfp4) operation by operation.
#include "kquant_pack.h"

#include <cstring>

#include "touchstone/model/quant.h"

namespace touchstone::static_graph {
namespace {

using gguf::TensorType;

template <typename B>
B load_block(const uint8_t* p) {
  B b;
  std::memcpy(&b, p, sizeof(B));
  return b;
}

void put(WeightSet& ws, const std::string& k, HostTensor t) {
  ws.bytes += t.bytes;
  ws.tensors[k] = std::move(t);
}

// ggml-quants.c get_scale_min_k4: the j-th 6-bit (scale, min) pair of 12 bytes.
void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// A Q5_0 / Q5_1 block's 32 five-bit values (deq_q5_0's x0 / x1 order) minus
// `bias` (16 for Q5_0's signed values, 0 for Q5_1) into dst[j * out].
template <typename Block>
void unpack_q5(const Block& x, int bias, int8_t* dst, int64_t out) {
  uint32_t qh;
  std::memcpy(&qh, x.qh, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> (j + 0)) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    dst[j * out] = int8_t(((x.qs[j] & 0x0F) | h0) - bias);
    dst[(j + 16) * out] = int8_t(((x.qs[j] >> 4) | h1) - bias);
  }
}

// A Q4_K / Q5_K super-block's 8 sub-block factors into rows sb * 8 + s of d
// and mn (column o): d = d * sc and m = -(dmin * min), so that q * d + m =
// deq_q4_K's / deq_q5_K's d1 * q - m1.
template <typename Block>
void store_k_factors(const Block& x, int64_t sb, int64_t o, int64_t out, HostTensor& d,
                     HostTensor& mn) {
  const float dd = gguf::fp16_to_fp32(x.d), dmin = gguf::fp16_to_fp32(x.dmin);
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    scale_min_k4(s, x.scales, sc, m);
    d.as<float>()[(sb * 8 + s) * out + o] = dd * sc;
    mn.as<float>()[(sb * 8 + s) * out + o] = -(dmin * m);
  }
}

// Q5_0 -> Q8_0 layout: qs [nb][32][out] = q - 16, d [nb][1][out] = the f16 bits.
void pack_q5_0(std::span<const uint8_t> raw, const std::string& name, int64_t in, int64_t out,
               int64_t row0, WeightSet& ws) {
  const int64_t nb = in / gguf::QK5_0;
  HostTensor qs = HostTensor::make({nb, 32, out}, "i8"), d = HostTensor::make({nb, 1, out}, "f16");
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t b = 0; b < nb; ++b) {
      const auto x = load_block<gguf::block_q5_0>(raw.data() + size_t((row0 + o) * nb + b) *
                                                                   sizeof(gguf::block_q5_0));
      d.as<uint16_t>()[b * out + o] = x.d;
      unpack_q5(x, 16, qs.as<int8_t>() + b * 32 * out + o, out);
    }
  }
  put(ws, name + ".qs", qs);
  put(ws, name + ".d", d);
}

// Q4_K -> Q4_1F: 8 sub-blocks of 32 per 256-row super-block; sub-block s holds
// element l as nibble l / 16 of byte l % 16 (the Q4_1 order); d and m as
// store_k_factors.
void pack_q4_k(std::span<const uint8_t> raw, const std::string& name, int64_t in, int64_t out,
               int64_t row0, WeightSet& ws) {
  const int64_t nsb = in / gguf::QK_K, nb = nsb * 8;
  HostTensor qs = HostTensor::make({nb, 16, out}, "i8"), d = HostTensor::make({nb, 1, out}, "f32"),
             mn = HostTensor::make({nb, 1, out}, "f32");
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const auto x = load_block<gguf::block_q4_K>(raw.data() + size_t((row0 + o) * nsb + sb) *
                                                                   sizeof(gguf::block_q4_K));
      store_k_factors(x, sb, o, out, d, mn);
      for (int s = 0; s < 8; ++s) {
        const int64_t b = sb * 8 + s;
        const uint8_t* q = x.qs + (s / 2) * 32;  // chunk of 64: sub-blocks 2c (low), 2c+1 (high)
        const int shift = (s % 2) * 4;
        uint8_t* dst = qs.as<uint8_t>() + b * 16 * out + o;
        for (int i = 0; i < 16; ++i) {
          const int lo = (q[i] >> shift) & 0xF, hi = (q[i + 16] >> shift) & 0xF;
          dst[i * out] = uint8_t(lo | (hi << 4));
        }
      }
    }
  }
  put(ws, name + ".qs", qs);
  put(ws, name + ".d", d);
  put(ws, name + ".m", mn);
}

// Q6_K -> Q8_16F: 16 sub-blocks of 16 per 256-row super-block, q - 32 as i8,
// d = d * sc (deq_q6_K's d * sc[is], before the product with q).
void pack_q6_k(std::span<const uint8_t> raw, const std::string& name, int64_t in, int64_t out,
               int64_t row0, WeightSet& ws) {
  const int64_t nsb = in / gguf::QK_K, nb = nsb * 16;
  HostTensor qs = HostTensor::make({nb, 16, out}, "i8"), d = HostTensor::make({nb, 1, out}, "f32");
  int8_t q[gguf::QK_K];
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const auto x = load_block<gguf::block_q6_K>(raw.data() + size_t((row0 + o) * nsb + sb) *
                                                                   sizeof(gguf::block_q6_K));
      const float dd = gguf::fp16_to_fp32(x.d);
      for (int n = 0; n < 2; ++n) {
        const uint8_t* ql = x.ql + n * 64;
        const uint8_t* qh = x.qh + n * 32;
        for (int l = 0; l < 32; ++l) {
          q[n * 128 + l + 0] = int8_t(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
          q[n * 128 + l + 32] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          q[n * 128 + l + 64] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          q[n * 128 + l + 96] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
      }
      for (int s = 0; s < 16; ++s) {
        const int64_t b = sb * 16 + s;
        d.as<float>()[b * out + o] = dd * x.scales[s];
        int8_t* dst = qs.as<int8_t>() + b * 16 * out + o;
        for (int i = 0; i < 16; ++i) dst[i * out] = q[s * 16 + i];
      }
    }
  }
  put(ws, name + ".qs", qs);
  put(ws, name + ".d", d);
}

// Q5_1 -> Q8_1: qs [nb][32][out] = q (0..31), d and m the block's f16 bits.
void pack_q5_1(std::span<const uint8_t> raw, const std::string& name, int64_t in, int64_t out,
               int64_t row0, WeightSet& ws) {
  const int64_t nb = in / gguf::QK5_1;
  HostTensor qs = HostTensor::make({nb, 32, out}, "i8"), d = HostTensor::make({nb, 1, out}, "f16"),
             mn = HostTensor::make({nb, 1, out}, "f16");
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t b = 0; b < nb; ++b) {
      const auto x = load_block<gguf::block_q5_1>(raw.data() + size_t((row0 + o) * nb + b) *
                                                                   sizeof(gguf::block_q5_1));
      d.as<uint16_t>()[b * out + o] = x.d;
      mn.as<uint16_t>()[b * out + o] = x.m;
      unpack_q5(x, 0, qs.as<int8_t>() + b * 32 * out + o, out);
    }
  }
  put(ws, name + ".qs", qs);
  put(ws, name + ".d", d);
  put(ws, name + ".m", mn);
}

// Q5_K -> Q8_1F: 8 sub-blocks of 32 per 256-row super-block, q (0..31) as i8;
// d and m as store_k_factors.
void pack_q5_k(std::span<const uint8_t> raw, const std::string& name, int64_t in, int64_t out,
               int64_t row0, WeightSet& ws) {
  const int64_t nsb = in / gguf::QK_K, nb = nsb * 8;
  HostTensor qs = HostTensor::make({nb, 32, out}, "i8"), d = HostTensor::make({nb, 1, out}, "f32"),
             mn = HostTensor::make({nb, 1, out}, "f32");
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const auto x = load_block<gguf::block_q5_K>(raw.data() + size_t((row0 + o) * nsb + sb) *
                                                                   sizeof(gguf::block_q5_K));
      store_k_factors(x, sb, o, out, d, mn);
      for (int s = 0; s < 8; ++s) {
        const int64_t b = sb * 8 + s;
        const uint8_t* ql = x.qs + (s / 2) * 32;  // chunk of 64: sub-blocks 2c (low), 2c+1 (high)
        const int shift = (s % 2) * 4;
        const unsigned bit = 1u << s;  // deq_q5_K's u1 / u2 for this sub-block
        int8_t* dst = qs.as<int8_t>() + b * 32 * out + o;
        for (int l = 0; l < 32; ++l)
          dst[l * out] = int8_t(((ql[l] >> shift) & 0xF) + ((x.qh[l] & bit) ? 16 : 0));
      }
    }
  }
  put(ws, name + ".qs", qs);
  put(ws, name + ".d", d);
  put(ws, name + ".m", mn);
}

// MXFP4 -> Q8_16F: each 32-row block as two 16-row blocks with the block's scale,
// q = kvalues_mxfp4[code] (the doubled e2m1 values) as i8, d = e8m0_to_fp32_half(e):
// q * d is deq_mxfp4's kvalues_mxfp4[code] * d.
void pack_mxfp4(std::span<const uint8_t> raw, const std::string& name, int64_t in, int64_t out,
                int64_t row0, WeightSet& ws) {
  const int64_t nb = in / gguf::QK_MXFP4;
  HostTensor qs = HostTensor::make({2 * nb, 16, out}, "i8"),
             d = HostTensor::make({2 * nb, 1, out}, "f32");
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t b = 0; b < nb; ++b) {
      const auto x = load_block<gguf::block_mxfp4>(raw.data() + size_t((row0 + o) * nb + b) *
                                                                    sizeof(gguf::block_mxfp4));
      const float scale = gguf::e8m0_to_fp32_half(x.e);
      d.as<float>()[(2 * b) * out + o] = scale;
      d.as<float>()[(2 * b + 1) * out + o] = scale;
      int8_t* lo = qs.as<int8_t>() + (2 * b) * 16 * out + o;  // elements 0-15: low nibbles
      int8_t* hi = lo + 16 * out;                             // elements 16-31: high nibbles
      for (int j = 0; j < 16; ++j) {
        lo[j * out] = gguf::kvalues_mxfp4[x.qs[j] & 0x0F];
        hi[j * out] = gguf::kvalues_mxfp4[x.qs[j] >> 4];
      }
    }
  }
  put(ws, name + ".qs", qs);
  put(ws, name + ".d", d);
}

}  // namespace

bool pack_kquant(const gguf::File& f, const gguf::TensorInfo& ti, const std::string& name,
                 int64_t in, int64_t out, int64_t row0, WeightSet& ws, MatrixFormat& fmt) {
  switch (ti.type) {
    case TensorType::Q5_0:
      pack_q5_0(f.tensor_data(ti), name, in, out, row0, ws);
      fmt = MatrixFormat::Q8_0;
      return true;
    case TensorType::Q4_K:
      pack_q4_k(f.tensor_data(ti), name, in, out, row0, ws);
      fmt = MatrixFormat::Q4_1F;
      return true;
    case TensorType::Q6_K:
      pack_q6_k(f.tensor_data(ti), name, in, out, row0, ws);
      fmt = MatrixFormat::Q8_16F;
      return true;
    case TensorType::Q5_1:
      pack_q5_1(f.tensor_data(ti), name, in, out, row0, ws);
      fmt = MatrixFormat::Q8_1;
      return true;
    case TensorType::Q5_K:
      pack_q5_k(f.tensor_data(ti), name, in, out, row0, ws);
      fmt = MatrixFormat::Q8_1F;
      return true;
    case TensorType::MXFP4:
      pack_mxfp4(f.tensor_data(ti), name, in, out, row0, ws);
      fmt = MatrixFormat::Q8_16F;
      return true;
    default:
      return false;
  }
}

}  // namespace touchstone::static_graph
