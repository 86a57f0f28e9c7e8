#include "touchstone/report/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "touchstone/report/report.h"

namespace touchstone {
namespace {

constexpr double kW = 560, kH = 220, kLeft = 64, kRight = 16, kTop = 28, kBottom = 40;
constexpr double kPw = kW - kLeft - kRight, kPh = kH - kTop - kBottom;

// Maps data to SVG coordinates; the y axis is linear or log10.
struct Axes {
  size_t n = 0;
  bool log_y = false;
  double lo = 0, hi = 1;  // in axis units (log10 for a log axis)

  double x(double i) const { return kLeft + (n > 1 ? i * kPw / double(n - 1) : kPw / 2); }
  double t(double v) const {
    if (!log_y) return v;
    return v > 0 ? std::max(std::log10(v), lo) : lo;
  }
  double y(double v) const {
    const double f = (std::clamp(t(v), lo, hi) - lo) / (hi - lo);
    return kTop + kPh - f * kPh;
  }
};

Axes make_axes(const PlotSpec& s) {
  Axes a{s.y.size(), s.log_y};
  double mn = INFINITY, mx = -INFINITY;
  for (double v : s.y) {
    if (!std::isfinite(v) || (s.log_y && v <= 0)) continue;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  if (s.log_y) {
    a.lo = std::isfinite(mn) ? std::max(std::floor(std::log10(mn)), -30.0) : -12;
    a.hi = std::isfinite(mx) ? std::ceil(std::log10(mx)) : a.lo + 4;
    if (s.band && s.band->second > 0) {  // the band gets at least a decade of height
      const double b = std::log10(s.band->second);
      a.lo = std::min(a.lo, std::floor(b) - 1);
      a.hi = std::max(a.hi, std::ceil(b));
    }
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    return a;
  }
  if (s.band) mx = std::max(mx, s.band->second);
  a.lo = std::isfinite(mn) ? std::min(mn, 0.0) : 0;
  a.hi = std::isfinite(mx) ? mx * 1.05 : 1;
  if (!(a.hi > a.lo)) a.hi = a.lo + 1;
  return a;
}

// 1, 2 or 5 x 10^k at least `raw`.
double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(std::max(raw, 1.0))));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string grid_and_ticks(const Axes& a) {
  std::string o;
  const int decades = int(a.hi - a.lo);
  const double ystep = a.log_y ? std::max(1, (decades + 4) / 5) : (a.hi - a.lo) / 4;
  for (double t = a.lo; t <= a.hi + 1e-9; t += ystep) {
    const double yy = kTop + kPh - (t - a.lo) / (a.hi - a.lo) * kPh;
    o += fmt::format(
        "<line class=\"ts-grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
        "<text class=\"ts-tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
        kLeft, yy, kLeft + kPw, yy, kLeft - 4, yy + 4,
        a.log_y ? fmt::format("1e{}", int(std::lround(t))) : fmt::format("{:.3g}", t));
  }
  const double xstep = a.n > 1 ? nice_step(double(a.n - 1) / 8) : 1;
  for (double i = 0; i < double(a.n); i += xstep) {
    o += fmt::format(
        "<text class=\"ts-tick\" x=\"{:.1f}\" y=\"{:.1f}\" "
        "text-anchor=\"middle\">{}</text>\n",
        a.x(i), kTop + kPh + 14, int(i));
  }
  return o;
}

// The finite values as polylines (a lone one as a circle); a tick at the top
// for each non-finite value.
std::string series(const PlotSpec& s, const Axes& a) {
  std::string o, nonfinite;
  std::vector<std::pair<double, double>> run;
  auto flush = [&] {
    if (run.size() == 1) {
      o += fmt::format("<circle class=\"ts-series-point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2\"/>\n",
                       run[0].first, run[0].second);
    } else if (run.size() > 1) {
      std::string pts;
      for (const auto& [x, y] : run)
        pts += fmt::format("{}{:.1f},{:.1f}", pts.empty() ? "" : " ", x, y);
      o += fmt::format("<polyline class=\"ts-series\" points=\"{}\"/>\n", pts);
    }
    run.clear();
  };
  for (size_t i = 0; i < s.y.size(); ++i) {
    if (std::isfinite(s.y[i])) {
      run.emplace_back(a.x(double(i)), a.y(s.y[i]));
      continue;
    }
    flush();
    nonfinite += fmt::format("M{:.1f} {:.1f}v8", a.x(double(i)), kTop);
  }
  flush();
  if (!nonfinite.empty()) {
    o += fmt::format(
        "<path class=\"ts-nonfinite\" d=\"{}\"><title>non-finite value</title>"
        "</path>\n",
        nonfinite);
  }
  return o;
}

std::string overlays(const PlotSpec& s, const Axes& a) {
  std::string o;
  for (int m : s.marks) {
    if (m < 0 || size_t(m) >= s.y.size()) continue;
    const double v = s.y[size_t(m)];
    o += fmt::format("<circle class=\"ts-mark\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\"/>\n", a.x(m),
                     std::isfinite(v) ? a.y(v) : kTop);
  }
  if (s.vline >= 0 && size_t(s.vline) < std::max<size_t>(s.y.size(), 1)) {
    o += fmt::format(
        "<line class=\"ts-first-divergence\" data-x=\"{}\" x1=\"{:.1f}\" y1=\"{:.1f}\" "
        "x2=\"{:.1f}\" y2=\"{:.1f}\"><title>{}</title></line>\n",
        s.vline, a.x(s.vline), kTop, a.x(s.vline), kTop + kPh, xml_escape(s.vline_label));
  }
  return o;
}

}  // namespace

std::string render_svg_plot(const PlotSpec& s) {
  const Axes a = make_axes(s);
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"ts-plot {}\" data-case=\"{}\" "
      "data-run=\"{}\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\">\n"
      "<title>{}</title>\n<text class=\"ts-plot-title\" x=\"{}\" y=\"18\">{}</text>\n",
      xml_escape(s.css_class), xml_escape(s.data_case), xml_escape(s.data_run), kW, kH, kW, kH,
      xml_escape(s.title), kLeft, xml_escape(s.title));
  o += fmt::format("<rect class=\"ts-plot-area\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n",
                   kLeft, kTop, kPw, kPh);
  if (s.band) {
    const double y1 = a.y(s.band->second), y0 = a.y(s.band->first);
    o += fmt::format(
        "<rect class=\"ts-near-tie-band\" x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\">"
        "<title>{}</title></rect>\n",
        kLeft, y1, kPw, std::max(0.0, y0 - y1), xml_escape(s.band_label));
  }
  o += grid_and_ticks(a);
  o += series(s, a);
  o += overlays(s, a);
  o += fmt::format(
      "<text class=\"ts-axis-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n"
      "<text class=\"ts-axis-label\" transform=\"translate(14 {:.1f}) rotate(-90)\" "
      "text-anchor=\"middle\">{}</text>\n</svg>\n",
      kLeft + kPw / 2, kH - 6, xml_escape(s.x_label), kTop + kPh / 2, xml_escape(s.y_label));
  return o;
}

}  // namespace touchstone
