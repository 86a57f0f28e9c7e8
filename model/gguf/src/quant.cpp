// quant.cpp - ggml type table, fp16/bf16 conversions and dequantization.
//
// Sources: block sizes from the type_traits table in ggml/src/ggml.c, layouts
// from ggml/src/ggml-common.h, formulas from dequantize_row_* in
// ggml/src/ggml-quants.c (kept in the same operation order so results match
// ggml exactly). Blocks are memcpy()ed to a local struct first, so `src`
// needs no alignment.
#include "touchstone/model/quant.h"

#include <array>
#include <bit>
#include <cstring>

#include "touchstone/common/error.h"

namespace touchstone::gguf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little-endian; big-endian hosts are not supported");

constexpr size_t kMaxType = 42;

constexpr std::array<TypeTraits, kMaxType> make_table() {
  std::array<TypeTraits, kMaxType> t{};
  auto set = [&t](TensorType ty, const char* name, uint32_t bs, uint32_t ts, bool q) {
    t[static_cast<size_t>(ty)] = TypeTraits{name, bs, ts, q};
  };
  set(TensorType::F32, "F32", 1, 4, false);
  set(TensorType::F16, "F16", 1, 2, false);
  set(TensorType::Q4_0, "Q4_0", QK4_0, sizeof(block_q4_0), true);
  set(TensorType::Q4_1, "Q4_1", QK4_1, sizeof(block_q4_1), true);
  set(TensorType::Q5_0, "Q5_0", QK5_0, sizeof(block_q5_0), true);
  set(TensorType::Q5_1, "Q5_1", QK5_1, sizeof(block_q5_1), true);
  set(TensorType::Q8_0, "Q8_0", QK8_0, sizeof(block_q8_0), true);
  set(TensorType::Q8_1, "Q8_1", QK8_1, sizeof(block_q8_1), true);
  set(TensorType::Q2_K, "Q2_K", QK_K, sizeof(block_q2_K), true);
  set(TensorType::Q3_K, "Q3_K", QK_K, sizeof(block_q3_K), true);
  set(TensorType::Q4_K, "Q4_K", QK_K, sizeof(block_q4_K), true);
  set(TensorType::Q5_K, "Q5_K", QK_K, sizeof(block_q5_K), true);
  set(TensorType::Q6_K, "Q6_K", QK_K, sizeof(block_q6_K), true);
  set(TensorType::Q8_K, "Q8_K", QK_K, sizeof(block_q8_K), true);
  set(TensorType::MXFP4, "MXFP4", QK_MXFP4, sizeof(block_mxfp4), true);
  // Sizes below follow ggml-common.h; these types can be listed and their
  // bytes read, but are not dequantized here.
  set(TensorType::IQ2_XXS, "IQ2_XXS", QK_K, 2 + QK_K / 4, true);
  set(TensorType::IQ2_XS, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32, true);
  set(TensorType::IQ3_XXS, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8, true);
  set(TensorType::IQ1_S, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16, true);
  set(TensorType::IQ4_NL, "IQ4_NL", 32, 2 + 16, true);
  set(TensorType::IQ3_S, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, true);
  set(TensorType::IQ2_S, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16, true);
  set(TensorType::IQ4_XS, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64, true);
  set(TensorType::I8, "I8", 1, 1, false);
  set(TensorType::I16, "I16", 1, 2, false);
  set(TensorType::I32, "I32", 1, 4, false);
  set(TensorType::I64, "I64", 1, 8, false);
  set(TensorType::F64, "F64", 1, 8, false);
  set(TensorType::IQ1_M, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, true);
  set(TensorType::BF16, "BF16", 1, 2, false);
  set(TensorType::TQ1_0, "TQ1_0", QK_K, 2 + 4 * 13, true);
  set(TensorType::TQ2_0, "TQ2_0", QK_K, 2 + 64, true);
  set(TensorType::NVFP4, "NVFP4", 64, 4 + 32, true);
  set(TensorType::Q1_0, "Q1_0", 128, 2 + 16, true);
  return t;
}

constexpr std::array<TypeTraits, kMaxType> kTypes = make_table();

template <typename Block>
Block load(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof(Block));
  return b;
}

float h2f(ggml_half h) { return fp16_to_fp32(h); }

// ---- per-type row kernels: k = number of elements, k % block_size == 0 ----
// The reference reads every weight row through these (it keeps weights as stored), so
// the block types' kernels are also compiled for AVX2 and picked at load (as ops::dot
// is): the same scalar source, each value from the same IEEE operations in the same
// order (no FMA contraction: -ffp-contract=off), so the bits do not depend on the clone.
#define TOUCHSTONE_DEQ_CLONES __attribute__((target_clones("avx2", "default")))

void deq_f32(const uint8_t* x, float* y, int64_t k) {
  std::memcpy(y, x, static_cast<size_t>(k) * 4);
}

void deq_f16(const uint8_t* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k; ++i) y[i] = fp16_to_fp32(load<uint16_t>(x + 2 * i));
}

void deq_bf16(const uint8_t* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k; ++i) y[i] = bf16_to_fp32(load<uint16_t>(x + 2 * i));
}

TOUCHSTONE_DEQ_CLONES void deq_q4_0(const uint8_t* src, float* y, int64_t k) {
  constexpr int qk = QK4_0;
  for (int64_t i = 0; i < k / qk; ++i) {
    const auto x = load<block_q4_0>(src + i * sizeof(block_q4_0));
    const float d = h2f(x.d);
    for (int j = 0; j < qk / 2; ++j) {
      const int x0 = (x.qs[j] & 0x0F) - 8;
      const int x1 = (x.qs[j] >> 4) - 8;
      y[i * qk + j + 0] = static_cast<float>(x0) * d;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q4_1(const uint8_t* src, float* y, int64_t k) {
  constexpr int qk = QK4_1;
  for (int64_t i = 0; i < k / qk; ++i) {
    const auto x = load<block_q4_1>(src + i * sizeof(block_q4_1));
    const float d = h2f(x.d);
    const float m = h2f(x.m);
    for (int j = 0; j < qk / 2; ++j) {
      const int x0 = (x.qs[j] & 0x0F);
      const int x1 = (x.qs[j] >> 4);
      y[i * qk + j + 0] = static_cast<float>(x0) * d + m;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q5_0(const uint8_t* src, float* y, int64_t k) {
  constexpr int qk = QK5_0;
  for (int64_t i = 0; i < k / qk; ++i) {
    const auto x = load<block_q5_0>(src + i * sizeof(block_q5_0));
    const float d = h2f(x.d);
    uint32_t qh;
    std::memcpy(&qh, x.qh, sizeof(qh));
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t xh_0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh_1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
      const int32_t x0 = ((x.qs[j] & 0x0F) | xh_0) - 16;
      const int32_t x1 = ((x.qs[j] >> 4) | xh_1) - 16;
      y[i * qk + j + 0] = static_cast<float>(x0) * d;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q5_1(const uint8_t* src, float* y, int64_t k) {
  constexpr int qk = QK5_1;
  for (int64_t i = 0; i < k / qk; ++i) {
    const auto x = load<block_q5_1>(src + i * sizeof(block_q5_1));
    const float d = h2f(x.d);
    const float m = h2f(x.m);
    uint32_t qh;
    std::memcpy(&qh, x.qh, sizeof(qh));
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t xh_0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh_1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
      const int x0 = (x.qs[j] & 0x0F) | xh_0;
      const int x1 = (x.qs[j] >> 4) | xh_1;
      y[i * qk + j + 0] = static_cast<float>(x0) * d + m;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q8_0(const uint8_t* src, float* y, int64_t k) {
  constexpr int qk = QK8_0;
  for (int64_t i = 0; i < k / qk; ++i) {
    const auto x = load<block_q8_0>(src + i * sizeof(block_q8_0));
    const float d = h2f(x.d);
    for (int j = 0; j < qk; ++j) y[i * qk + j] = static_cast<float>(x.qs[j]) * d;
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q2_K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; ++i) {
    const auto x = load<block_q2_K>(src + i * sizeof(block_q2_K));
    const float d = h2f(x.d);
    const float min = h2f(x.dmin);
    const uint8_t* q = x.qs;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc = x.scales[is++];
        float dl = d * static_cast<float>(sc & 0xF);
        float ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l] >> shift) & 3) - ml;
        sc = x.scales[is++];
        dl = d * static_cast<float>(sc & 0xF);
        ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16] >> shift) & 3) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q3_K(const uint8_t* src, float* y, int64_t k) {
  constexpr uint32_t kmask1 = 0x03030303;
  constexpr uint32_t kmask2 = 0x0f0f0f0f;
  for (int64_t i = 0; i < k / QK_K; ++i) {
    const auto x = load<block_q3_K>(src + i * sizeof(block_q3_K));
    const float d_all = h2f(x.d);
    const uint8_t* q = x.qs;
    const uint8_t* hm = x.hmask;
    uint8_t m = 1;
    // Unpack the 16 6-bit scales (12 bytes) into 16 int8 values.
    uint32_t aux[4];
    std::memcpy(aux, x.scales, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
        dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

// ggml-quants.c get_scale_min_k4: 8 6-bit (scale, min) pairs packed in 12 bytes.
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q4_K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; ++i) {
    const auto x = load<block_q4_K>(src + i * sizeof(block_q4_K));
    const uint8_t* q = x.qs;
    const float d = h2f(x.d);
    const float min = h2f(x.dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < QK_K; j += 64) {
      get_scale_min_k4(is + 0, x.scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x.scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q5_K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; ++i) {
    const auto x = load<block_q5_K>(src + i * sizeof(block_q5_K));
    const uint8_t* ql = x.qs;
    const uint8_t* qh = x.qh;
    const float d = h2f(x.d);
    const float min = h2f(x.dmin);
    int is = 0;
    uint8_t sc, m;
    unsigned u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K; j += 64) {
      get_scale_min_k4(is + 0, x.scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x.scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q6_K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; ++i) {
    const auto x = load<block_q6_K>(src + i * sizeof(block_q6_K));
    const float d = h2f(x.d);
    const uint8_t* ql = x.ql;
    const uint8_t* qh = x.qh;
    const int8_t* sc = x.scales;
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

TOUCHSTONE_DEQ_CLONES void deq_q8_K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; ++i) {
    const auto x = load<block_q8_K>(src + i * sizeof(block_q8_K));
    for (int j = 0; j < QK_K; ++j) *y++ = x.d * static_cast<float>(x.qs[j]);
  }
}

// ggml-quants.c dequantize_row_mxfp4: y[j] = kvalues_mxfp4[low nibble of qs[j]] * d,
// y[j + 16] = kvalues_mxfp4[high nibble] * d, d = e8m0_to_fp32_half(e) (int8 * fp32, exact).
TOUCHSTONE_DEQ_CLONES void deq_mxfp4(const uint8_t* src, float* y, int64_t k) {
  for (int64_t i = 0; i < k / QK_MXFP4; ++i) {
    const auto x = load<block_mxfp4>(src + i * sizeof(block_mxfp4));
    const float d = e8m0_to_fp32_half(x.e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      y[j] = static_cast<float>(kvalues_mxfp4[x.qs[j] & 0x0F]) * d;
      y[j + QK_MXFP4 / 2] = static_cast<float>(kvalues_mxfp4[x.qs[j] >> 4]) * d;
    }
    y += QK_MXFP4;
  }
}

using RowFn = void (*)(const uint8_t*, float*, int64_t);

RowFn row_fn(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return deq_f32;
    case TensorType::F16:
      return deq_f16;
    case TensorType::BF16:
      return deq_bf16;
    case TensorType::Q4_0:
      return deq_q4_0;
    case TensorType::Q4_1:
      return deq_q4_1;
    case TensorType::Q5_0:
      return deq_q5_0;
    case TensorType::Q5_1:
      return deq_q5_1;
    case TensorType::Q8_0:
      return deq_q8_0;
    case TensorType::Q2_K:
      return deq_q2_K;
    case TensorType::Q3_K:
      return deq_q3_K;
    case TensorType::Q4_K:
      return deq_q4_K;
    case TensorType::Q5_K:
      return deq_q5_K;
    case TensorType::Q6_K:
      return deq_q6_K;
    case TensorType::Q8_K:
      return deq_q8_K;
    case TensorType::MXFP4:
      return deq_mxfp4;
    default:
      return nullptr;
  }
}

}  // namespace

float e8m0_to_fp32_half(uint8_t x) {
  // ggml-impl.h: x < 2 gives the subnormal patterns 0x00200000 << x (2^-128, 2^-127);
  // otherwise 0.5 * 2^(x - 127) = 2^(x - 128), the normal number of exponent field x - 1.
  const uint32_t bits = x < 2 ? uint32_t{0x00200000} << x : uint32_t(x - 1) << 23;
  return std::bit_cast<float>(bits);
}

const TypeTraits* find_type_traits(TensorType t) {
  const auto i = static_cast<size_t>(t);
  if (i >= kTypes.size() || kTypes[i].name == nullptr) return nullptr;
  return &kTypes[i];
}

const TypeTraits& type_traits(TensorType t) {
  const TypeTraits* tt = find_type_traits(t);
  if (tt == nullptr)
    throw Error("unknown or unsupported ggml tensor type {}", static_cast<uint32_t>(t));
  return *tt;
}

std::string_view type_name(TensorType t) {
  if (const TypeTraits* tt = find_type_traits(t)) return tt->name;
  // Unknown: "type#N". Kept in a thread-local buffer so a string_view can be returned.
  thread_local std::array<std::string, 4> names;
  thread_local size_t next = 0;
  std::string& s = names[next++ % names.size()];
  s = fmt::format("type#{}", static_cast<uint32_t>(t));
  return s;
}

bool can_dequantize(TensorType t) { return row_fn(t) != nullptr; }

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 (exact in fp32).
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN (payload kept)
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_fp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {  // inf or NaN (NaN stays quiet NaN)
    return static_cast<uint16_t>(sign | 0x7C00u |
                                 (x > 0x7F800000u ? 0x200u | ((x >> 13) & 0x3FFu) : 0u));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                                               // below 2^-14: subnormal
    if (x < 0x33000000u) return sign;                                  // < 2^-25 rounds to 0
    const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - (x >> 23);  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t r = x - 0x38000000u;  // rebias exponent 127 -> 15
  return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  const RowFn fn = row_fn(type);
  if (fn == nullptr) throw Error("dequantize: type {} is not supported", type_name(type));
  const TypeTraits& tt = type_traits(type);
  if (n < 0 || n % tt.block_size != 0)
    throw Error("dequantize: {} elements is not a multiple of the {} block size {}", n, tt.name,
                tt.block_size);
  if (n == 0) return;
  fn(static_cast<const uint8_t*>(src), dst, n);
}

std::vector<float> dequantize(const File& f, const TensorInfo& t) {
  if (!can_dequantize(t.type))
    throw Error("{}: tensor '{}': dequantization of type {} is not supported", f.path(), t.name,
                type_name(t.type));
  const std::span<const uint8_t> bytes = f.tensor_data(t);  // bounds-checked
  std::vector<float> out(t.n_elements);
  dequantize_row(t.type, bytes.data(), out.data(), static_cast<int64_t>(t.n_elements));
  return out;
}

}  // namespace touchstone::gguf
