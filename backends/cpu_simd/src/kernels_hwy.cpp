// kernels_hwy.cpp - fp32 vector kernels (dot, matvec, axpy, scale, the gated FFN
// activation) and the choice of Highway target; compiled once per target
// (foreach_target) and dispatched at run time (HWY_DYNAMIC_DISPATCH). Attention:
// kernels_hwy_attention.cpp; GGUF blocks x fp32: kernels_hwy_blocks.cpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// after highway.h (per-target -inl header):
#include "hwy/contrib/math/math-inl.h"
#include "kernels_hwy-inl.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"

#ifndef TS_CPU_KERNELS_HWY_ONCE
#define TS_CPU_KERNELS_HWY_ONCE
namespace touchstone::cpu_simd {
// The scalar form of gated_act_f64 (lanes outside the vector range): the
// reference's own functions (std::tanh / std::exp).
inline float ScalarGatedAct(bool gelu, float g, float u) {
  const double x = g;
  const double act = gelu ? touchstone::ops::gelu_tanh(x) : touchstone::ops::silu(x);
  return static_cast<float>(act * double{u});
}
}  // namespace touchstone::cpu_simd
#endif

HWY_BEFORE_NAMESPACE();
namespace touchstone::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four vector accumulators over i = 4*N*k + j*N, then (a0+a1)+(a2+a3), then a
// lane reduction, then the scalar tail in order (kernels_hwy-inl.h: DotLanes).
HWY_ATTR float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  return DotLanes(a, b, n);
}

HWY_ATTR void MatvecF32(const float* HWY_RESTRICT W, size_t ld, const float* HWY_RESTRICT x,
                        float* HWY_RESTRICT y, size_t n_rows, size_t n) {
  for (size_t r = 0; r < n_rows; ++r) y[r] = DotF32(W + r * ld, x, n);
}

HWY_ATTR void AxpyF32(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto va = hn::Set(df, alpha);
  size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

HWY_ATTR void ScaleF32(float alpha, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto va = hn::Set(df, alpha);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(va, hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] *= alpha;
}
// ---- gated FFN activation in fp64 (see kernels.h: gated_act_f64) ----
// One lane's fp64 operations, in the scalar formula's order (this file is built
// with -ffp-contract=off, so no operation is fused).
template <class D>
HWY_ATTR HWY_INLINE hn::Vec<D> GatedActVec(D dd, bool gelu, hn::Vec<D> x, hn::Vec<D> u) {
  hn::Vec<D> act;
  if (gelu) {  // 0.5 * x * (1.0 + tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)))
    const auto cube = hn::Mul(hn::Mul(hn::Mul(hn::Set(dd, 0.044715), x), x), x);
    const auto th =
        hn::Tanh(dd, hn::Mul(hn::Set(dd, 0.79788456080286535587989211986876), hn::Add(x, cube)));
    act = hn::Mul(hn::Mul(hn::Set(dd, 0.5), x), hn::Add(hn::Set(dd, 1.0), th));
  } else {  // x / (1.0 + exp(-x))
    act = hn::Div(x, hn::Add(hn::Set(dd, 1.0), hn::Exp(dd, hn::Neg(x))));
  }
  return hn::Mul(act, u);
}

HWY_ATTR void GatedActF64(int gelu, float* HWY_RESTRICT g, const float* HWY_RESTRICT u, size_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t N = hn::Lanes(dd);
  // Highway's Exp / Tanh are valid on [-700, 700]; a lane outside (-500, 500)
  // (large, inf, NaN) takes the scalar formula, which gives the reference's
  // inf / NaN. Lanes are independent, so each element's result depends only
  // on its own inputs (not on n or on its neighbours).
  const auto lim = hn::Set(dd, 500.0);
  for (size_t i = 0; i < n; i += N) {
    if (i + N <= n) {
      const auto x = hn::PromoteTo(dd, hn::LoadU(df, g + i));
      if (hn::AllTrue(dd, hn::Lt(hn::Abs(x), lim))) {
        const auto y = GatedActVec(dd, gelu != 0, x, hn::PromoteTo(dd, hn::LoadU(df, u + i)));
        hn::StoreU(hn::DemoteTo(df, y), df, g + i);
        continue;
      }
    }
    const size_t m = n - i < N ? n - i : N;  // tail or a vector with a lane out of range
    float gx[16] = {}, ux[16] = {}, y[16];
    memcpy(gx, g + i, m * sizeof(float));
    memcpy(ux, u + i, m * sizeof(float));
    const auto v = GatedActVec(dd, gelu != 0, hn::PromoteTo(dd, hn::LoadU(df, gx)),
                               hn::PromoteTo(dd, hn::LoadU(df, ux)));
    hn::StoreU(hn::DemoteTo(df, v), df, y);
    for (size_t k = 0; k < m; ++k)
      g[i + k] = std::fabs(gx[k]) < 500.0f ? y[k] : ScalarGatedAct(gelu != 0, gx[k], ux[k]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace touchstone::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace touchstone::cpu_simd {
HWY_EXPORT(DotF32);
HWY_EXPORT(MatvecF32);
HWY_EXPORT(AxpyF32);
HWY_EXPORT(ScaleF32);
HWY_EXPORT(GatedActF64);

void gated_act_f64(bool gelu, float* g, const float* u, size_t n) {
  HWY_DYNAMIC_DISPATCH(GatedActF64)(gelu ? 1 : 0, g, u, n);
}
float dot_f32(const float* a, const float* b, size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n);
}
void matvec_f32(const float* W, size_t ld, const float* x, float* y, size_t n_rows, size_t n) {
  HWY_DYNAMIC_DISPATCH(MatvecF32)(W, ld, x, y, n_rows, n);
}
void axpy_f32(float a, const float* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyF32)(a, x, y, n);
}
void scale_f32(float a, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(ScaleF32)(a, y, n); }

namespace {

// What this CPU runs, read before anything is forced: in Highway 1.0.3 the mask
// of SetSupportedTargetsForTest replaces hwy::SupportedTargets() (it is not
// intersected with the CPU's). Every forcing below calls this first.
int64_t cpu_targets() {
  static const int64_t t = hwy::SupportedTargets();
  return t;
}

// The target force_hwy_target(0) restores: 0 (all), or TOUCHSTONE_CPU_SIMD_TARGET's.
std::atomic<int64_t> g_default_target{0};

std::string names(const std::vector<IsaTarget>& ts, bool runnable_only) {
  std::string out;
  for (const IsaTarget& t : ts) {
    if (runnable_only && !t.runnable) continue;
    out += (out.empty() ? "" : " ") + t.name;
  }
  return out.empty() ? "none" : out;
}

bool same_name(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }

}  // namespace

std::vector<std::pair<int64_t, std::string>> hwy_targets() {
  std::vector<std::pair<int64_t, std::string>> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.emplace_back(t, hwy::TargetName(t));
  return out;
}

void force_hwy_target(int64_t target) {
  cpu_targets();
  hwy::SetSupportedTargetsForTest(target ? target : g_default_target.load());
}

std::vector<IsaTarget> compiled_hwy_targets() {
  std::vector<IsaTarget> out;
  // HWY_TARGETS: the targets foreach_target compiled this file for; lower bit = better.
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    const int64_t bit = rest & -rest;
    out.push_back({bit, hwy::TargetName(bit), (cpu_targets() & bit) != 0});
  }
  return out;
}

QLevel qlevel_cap(int64_t hwy_target) {
#if HWY_ARCH_X86
  if (hwy_target == HWY_AVX3_DL) return QLevel::AVX512VNNI;
  if (hwy_target == HWY_AVX3 || hwy_target == HWY_AVX2) return QLevel::AVX2;
#endif
  (void)hwy_target;
  return QLevel::Scalar;
}

const IsaSelection& select_isa_from_env() {
  static const IsaSelection sel = [] {
    IsaSelection s;
    const char* env = std::getenv("TOUCHSTONE_CPU_SIMD_TARGET");
    if (!env || !*env) return s;
    const std::vector<IsaTarget> ts = compiled_hwy_targets();
    const std::string lists = " (compiled into cpu_simd: " + names(ts, false) +
                              "; this CPU runs: " + names(ts, true) + ")";
    for (const IsaTarget& t : ts) {
      if (!same_name(t.name, env)) continue;
      if (!t.runnable) {
        s.status = IsaSelection::NotRunnable;
        s.message = "TOUCHSTONE_CPU_SIMD_TARGET=" + std::string(env) +
                    ": this CPU cannot run the Highway target " + t.name + lists;
        return s;
      }
      s.forced = t.name;
      g_default_target.store(t.bit);
      force_hwy_target(t.bit);
      cap_qlevel(qlevel_cap(t.bit));
      return s;
    }
    s.status = IsaSelection::NotCompiled;
    s.message = "TOUCHSTONE_CPU_SIMD_TARGET=" + std::string(env) +
                ": not a Highway target compiled into cpu_simd" + lists;
    return s;
  }();
  return sel;
}

std::string hwy_current_target() {
  // The best target among those supported (and not masked by a test).
  const int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(supported & -supported);
}
}  // namespace touchstone::cpu_simd
#endif
