// serving_taps.cpp - the first divergent layer of a failing serving
// comparison, from two layer-tap records (serving_internal.h).
#include <fmt/format.h>

#include <cstring>
#include <exception>

#include "row_compare.h"
#include "serving_internal.h"
#include "touchstone/golden/golden.h"
#include "touchstone/metrics/metrics.h"

namespace touchstone::detail {

std::optional<LayerDivergence> first_divergent_tap(std::span<const float> ref,
                                                   std::span<const float> test,
                                                   const ServingOptions& o, bool bitwise,
                                                   int position) {
  const size_t d = o.tap_dim;
  if (d == 0 || ref.size() != o.tap_floats || test.size() != o.tap_floats) return std::nullopt;
  for (size_t k = 0; k < o.tap_floats / d; ++k) {  // layers in order, points in order
    const std::span<const float> a = ref.subspan(k * d, d), b = test.subspan(k * d, d);
    const double e = metrics::nmse(a, b);
    const bool differs = bitwise ? std::memcmp(a.data(), b.data(), d * sizeof(float)) != 0
                                 : !(e <= o.layer_tolerance);
    if (differs) {
      return LayerDivergence{
          position, int(k / kTapPoints), int(k % kTapPoints), e, bitwise ? 0.0 : o.layer_tolerance,
          {}};
    }
  }
  return std::nullopt;
}

void note_layers(CaseResult& r, std::span<const float> ref, std::span<const float> test,
                 const ServingOptions& o, bool bitwise, int position, const std::string& where) {
  if (!r.layer_locus.empty() || o.tap_floats == 0) return;
  r.first_layer_divergence = first_divergent_tap(ref, test, o, bitwise, position);
  r.layer_locus = fmt::format(" at position {}{}", position, where);
}

void try_locate(CaseResult& r, const ServingOptions& o, const std::function<void()>& locate) {
  if (o.tap_floats == 0 || !r.layer_locus.empty() || !r.layer_not_located.empty()) return;
  try {
    locate();
  } catch (const std::exception& e) {
    r.layer_not_located = e.what();
  }
}

std::string layer_line(const CaseResult& r) {
  if (!r.layer_not_located.empty())
    return "first divergent layer not located: " + r.layer_not_located;
  if (r.layer_locus.empty()) return "";
  if (!r.first_layer_divergence) {
    return fmt::format(
        "every layer tap matches{}: the divergence is after the last layer (output norm, LM "
        "head, logit softcap) or in the logits rows returned",
        r.layer_locus);
  }
  const LayerDivergence& l = *r.first_layer_divergence;
  if (l.tolerance == 0.0) {
    return fmt::format("first divergent layer{}: layer {}, {}: not bitwise identical (NMSE {:.3e})",
                       r.layer_locus, l.layer, l.point_name(), l.nmse);
  }
  return fmt::format("first divergent layer{}: layer {}, {}: NMSE {:.3e} > {:.1e}", r.layer_locus,
                     l.layer, l.point_name(), l.nmse, l.tolerance);
}

}  // namespace touchstone::detail
