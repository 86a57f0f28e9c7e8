// touchstone/report/svg_plot.h - a small inline-SVG line plot for the HTML report:
// no script, no external resources, stable classes for tests and styling.
//
//   <svg class="ts-plot CLASS" data-case="NAME" data-run="RUN" ...>
//     <rect class="ts-near-tie-band"/>       (band, when set)
//     <polyline class="ts-series"/>          (one per run of finite values)
//     <circle class="ts-mark"/>              (marks, e.g. top-1 mismatches)
//     <line class="ts-first-divergence"/>    (vline, when >= 0)
//     <path class="ts-nonfinite"/>           (a tick at the top per non-finite value)
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace touchstone {

struct PlotSpec {
  std::string css_class;            // extra class, e.g. "ts-plot-kl"
  std::string data_case, data_run;  // data-case / data-run attributes (escaped)
  std::string title;                // shown above the plot
  std::string x_label, y_label;     // axis captions
  bool log_y = false;               // log10 axis; values <= 0 sit on the bottom
  std::vector<double> y;            // y[i] at x = i; NaN / Inf = non-finite (a tick at the top)
  std::optional<std::pair<double, double>> band;  // shaded y range [lo, hi]
  std::string band_label;                         // its <title>
  int vline = -1;                                 // x of the vertical line (first divergence)
  std::string vline_label;                        // its <title>
  std::vector<int> marks;                         // x positions marked with a circle
};

std::string render_svg_plot(const PlotSpec& spec);

}  // namespace touchstone
