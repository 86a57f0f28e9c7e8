// moe_router.cpp - softmax top-k expert routing; see touchstone/model/moe_router.h.
#include "touchstone/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "touchstone/common/error.h"

namespace touchstone::ops {

std::vector<double> softmax(std::span<const float> logits) {
  double max_l = -INFINITY;
  bool nan = false;
  for (float l : logits) {
    nan |= std::isnan(l);
    max_l = std::max(max_l, double{l});
  }
  std::vector<double> p(logits.size());
  if (nan) {
    std::fill(p.begin(), p.end(), NAN);
    return p;
  }
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp(double{logits[i]} - max_l);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  return p;
}

std::vector<int32_t> top_k_experts(std::span<const double> probs, int32_t k) {
  if (k < 1 || size_t(k) > probs.size()) {
    throw Error("top_k_experts: k = {} outside [1, {}]", k, probs.size());
  }
  std::vector<int32_t> idx(probs.size());
  std::iota(idx.begin(), idx.end(), 0);
  // NaN is ordered after every number, so the comparison stays a strict weak order.
  auto key = [&](int32_t i) { return std::isnan(probs[size_t(i)]) ? -INFINITY : probs[size_t(i)]; };
  auto before = [&](int32_t a, int32_t b) {
    const double ka = key(a), kb = key(b);
    if (ka != kb) return ka > kb;
    return !std::isnan(probs[size_t(a)]) && std::isnan(probs[size_t(b)]);
  };
  std::stable_sort(idx.begin(), idx.end(), before);  // equal: lower index first
  idx.resize(size_t(k));
  return idx;
}

std::vector<ExpertWeight> route_softmax_top_k(std::span<const float> logits, int32_t k,
                                              bool renormalise) {
  const std::vector<double> p = softmax(logits);
  const std::vector<int32_t> chosen = top_k_experts(p, k);
  std::vector<ExpertWeight> out;
  double sum = 0.0;  // in selection order
  for (int32_t e : chosen) {
    out.push_back({e, p[size_t(e)]});
    sum += p[size_t(e)];
  }
  if (renormalise) {
    for (ExpertWeight& w : out) w.weight /= sum;
  }
  return out;
}

std::vector<ExpertWeight> route_top_k_softmax(std::span<const float> logits, int32_t k) {
  const std::vector<double> r(logits.begin(), logits.end());
  const std::vector<int32_t> chosen = top_k_experts(r, k);
  std::vector<float> top;
  for (int32_t e : chosen) top.push_back(logits[size_t(e)]);
  const std::vector<double> p = softmax(top);
  std::vector<ExpertWeight> out;
  for (size_t i = 0; i < chosen.size(); ++i) out.push_back({chosen[i], p[i]});
  return out;
}

}  // namespace touchstone::ops
