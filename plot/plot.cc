#include "plot/plot.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace ringmaster::plot {
namespace {

constexpr int kMinSize = 200;
constexpr double kFont = 12;  // Pixels; tick, legend and annotation text.
// A white outline behind annotation text, so it stays readable over grid and data lines.
constexpr absl::string_view kHalo =
    " stroke=\"white\" stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\"";
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Escape(absl::string_view s) {
  return absl::StrReplaceAll(
      s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&apos;"}});
}

std::string Px(double v) { return absl::StrFormat("%.1f", v); }

// Rough width of sans-serif text, enough to size margins.
double TextWidth(absl::string_view s) { return s.size() * kFont * 0.6; }

// The smallest 1, 2 or 5 times a power of ten that is >= v > 0.
double NiceStep(double v) {
  double p = std::pow(10, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * p >= v * (1 - 1e-9)) return m * p;
  }
  return 10 * p;
}

// Tick positions (in axis units: log2 bytes, GB/s, or log10 GB/s) and their labels.
struct Axis {
  double lo = 0, hi = 1;
  std::vector<std::pair<double, std::string>> ticks;
};

// Integer exponents [lo, hi] covering [min_exp, max_exp], ticked every `stride`-th power
// where stride is the smallest power of two that keeps at most `max_ticks` ticks.
Axis PowerAxis(double min_exp, double max_exp, int max_ticks, int base) {
  Axis a;
  a.lo = std::floor(min_exp);
  a.hi = std::ceil(max_exp);
  if (a.lo == a.hi) --a.lo, ++a.hi;
  int stride = 1;
  while ((a.hi - a.lo) / stride + 1 > std::max(max_ticks, 2)) stride *= 2;
  for (int p = static_cast<int>(a.lo); p <= a.hi; ++p) {
    if (((p % stride) + stride) % stride != 0) continue;
    a.ticks.emplace_back(
        p, base == 2 ? FormatBytes(std::exp2(p)) : absl::StrFormat("%g", std::pow(10.0, p)));
  }
  return a;
}

// [lo, hi] covering [vmin, vmax] and 0 with `headroom` (1.05: 5%, so that the maximum is not
// drawn on the frame), rounded out to about five nice steps.
Axis LinearAxis(double vmin, double vmax, double headroom = 1.05) {
  Axis a;
  vmin = std::min(vmin * headroom, 0.0);
  vmax = std::max(vmax * headroom, 0.0);
  if (vmax - vmin <= 0) vmax = 1;
  double step = NiceStep((vmax - vmin) / 5);
  a.lo = std::floor(vmin / step) * step;
  a.hi = std::ceil(vmax / step - 1e-9) * step;
  int n = static_cast<int>(std::lround((a.hi - a.lo) / step));
  for (int i = 0; i <= n; ++i) {
    double v = a.lo + i * step;
    if (std::fabs(v) < step * 1e-9) v = 0;
    a.ticks.emplace_back(v, absl::StrFormat("%g", v));
  }
  return a;
}

}  // namespace

std::string FormatBytes(double bytes) {
  static constexpr const char* kSuffix[] = {"", "K", "M", "G", "T", "P"};
  if (!std::isfinite(bytes)) return absl::StrFormat("%g", bytes);
  double v = std::fabs(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 5) v /= 1024, ++unit;
  return absl::StrCat(bytes < 0 ? "-" : "", absl::StrFormat("%.4g", v), kSuffix[unit]);
}

std::string RenderSvg(const PlotSpec& spec) {
  const int width = std::max(spec.width, kMinSize), height = std::max(spec.height, kMinSize);
  const bool log_x = spec.x_scale == XScale::kLog2Bytes;
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!log_x || x > 0) && (!spec.log_y || y > 0);
  };
  // An x value in axis units: log2 bytes, or itself.
  auto axis_x = [&](double x) { return log_x ? std::log2(x) : x; };

  // Data ranges: x over usable points, y over usable points and reference lines.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double x_min = kInf, x_max = -kInf, y_min = kInf, y_max = -kInf;
  for (const Series& s : spec.series) {
    for (auto [x, y] : s.points) {
      if (!usable(x, y)) continue;
      x_min = std::min(x_min, x), x_max = std::max(x_max, x);
      y_min = std::min(y_min, y), y_max = std::max(y_max, y);
    }
  }
  if (x_min > x_max) x_min = 1, x_max = 1024;  // No data: show 1..1K (or 1..1024).
  for (const HorizontalLine& l : spec.lines) {
    if (usable(1, l.y)) y_min = std::min(y_min, l.y), y_max = std::max(y_max, l.y);
  }

  // Layout: legend in the right margin, sized to the longest label (at most a third).
  double legend_w = 0;
  for (const Series& s : spec.series) legend_w = std::max(legend_w, 44 + TextWidth(s.label));
  legend_w = std::min(legend_w, width / 3.0);
  // Region labels sit in a strip above the frame, clear of data and line labels.
  const double left = 72, right = 20 + legend_w, bottom = 56,
               top = (spec.title.empty() ? 20 : 44) + (spec.regions.empty() ? 0 : 16);
  const double pw = width - left - right, ph = height - top - bottom;

  Axis xa = log_x ? PowerAxis(std::log2(x_min), std::log2(x_max), static_cast<int>(pw / 44), 2)
                  : LinearAxis(x_min, x_max, /*headroom=*/1.0);
  Axis ya;
  if (!spec.log_y) {
    ya = LinearAxis(y_min > y_max ? 0 : y_min, y_min > y_max ? 0 : y_max);
  } else if (y_min > y_max) {
    ya = PowerAxis(0, 1, static_cast<int>(ph / 24), 10);
  } else {
    ya = PowerAxis(std::log10(y_min), std::log10(y_max), static_cast<int>(ph / 24), 10);
  }
  auto px_x = [&](double axis_value) {
    return left + (axis_value - xa.lo) / (xa.hi - xa.lo) * pw;
  };
  auto px_y = [&](double axis_y) { return top + ph - (axis_y - ya.lo) / (ya.hi - ya.lo) * ph; };
  auto map_y = [&](double y) { return px_y(spec.log_y ? std::log10(y) : y); };
  auto text = [](double x, double y, absl::string_view anchor, absl::string_view fill,
                 absl::string_view body, absl::string_view extra = "") {
    return absl::StrCat("<text x=\"", Px(x), "\" y=\"", Px(y), "\" text-anchor=\"", anchor,
                        "\" fill=\"", fill, "\"", extra, ">", Escape(body), "</text>\n");
  };

  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"%g\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height, kFont);
  if (!spec.title.empty()) {
    absl::StrAppend(&out, text(width / 2.0, 28, "middle", "#222", spec.title,
                               " font-size=\"18\" font-weight=\"bold\""));
  }

  // Regions under everything else, clamped to the x range.
  absl::StrAppend(&out, "<g class=\"regions\">\n");
  for (const Region& r : spec.regions) {
    if (std::isnan(r.x_min) || std::isnan(r.x_max)) continue;
    double a = std::clamp(r.x_min > 0 || !log_x ? axis_x(r.x_min) : xa.lo, xa.lo, xa.hi);
    double b = std::clamp(r.x_max > 0 || !log_x ? axis_x(r.x_max) : xa.lo, xa.lo, xa.hi);
    if (b <= a) continue;
    std::string color = Escape(r.color.empty() ? "#888888" : r.color);
    absl::StrAppend(&out, "<rect x=\"", Px(px_x(a)), "\" y=\"", Px(top), "\" width=\"",
                    Px(px_x(b) - px_x(a)), "\" height=\"", Px(ph), "\" fill=\"", color,
                    "\" fill-opacity=\"0.12\"/>\n",
                    text((px_x(a) + px_x(b)) / 2, top - 6, "middle", "#444", r.label));
  }
  absl::StrAppend(&out, "</g>\n<g class=\"axes\" stroke-width=\"1\">\n");

  // Grid lines, ticks and tick labels, then the frame and axis titles.
  for (const auto& [v, label] : xa.ticks) {
    std::string x = Px(px_x(v));
    absl::StrAppend(&out, "<line x1=\"", x, "\" y1=\"", Px(top), "\" x2=\"", x, "\" y2=\"",
                    Px(top + ph), "\" stroke=\"#e4e4e4\"/>\n<line x1=\"", x, "\" y1=\"",
                    Px(top + ph), "\" x2=\"", x, "\" y2=\"", Px(top + ph + 5),
                    "\" stroke=\"#333\"/>\n",
                    text(px_x(v), top + ph + 19, "middle", "#333", label));
  }
  for (const auto& [v, label] : ya.ticks) {
    std::string y = Px(px_y(v));
    absl::StrAppend(&out, "<line x1=\"", Px(left), "\" y1=\"", y, "\" x2=\"", Px(left + pw),
                    "\" y2=\"", y, "\" stroke=\"#e4e4e4\"/>\n<line x1=\"", Px(left - 5), "\" y1=\"",
                    y, "\" x2=\"", Px(left), "\" y2=\"", y, "\" stroke=\"#333\"/>\n",
                    text(left - 8, px_y(v) + 4, "end", "#333", label));
  }
  absl::StrAppend(&out, "<rect x=\"", Px(left), "\" y=\"", Px(top), "\" width=\"", Px(pw),
                  "\" height=\"", Px(ph), "\" fill=\"none\" stroke=\"#333\"/>\n",
                  text(left + pw / 2, height - 14, "middle", "#222", spec.x_label),
                  text(18, top + ph / 2, "middle", "#222", spec.y_label,
                       absl::StrCat(" transform=\"rotate(-90 18 ", Px(top + ph / 2), ")\"")),
                  "</g>\n<g class=\"lines\">\n");

  for (const HorizontalLine& l : spec.lines) {
    if (!usable(1, l.y)) continue;
    std::string color = Escape(l.color.empty() ? "#666666" : l.color), y = Px(map_y(l.y));
    absl::StrAppend(&out, "<line x1=\"", Px(left), "\" y1=\"", y, "\" x2=\"", Px(left + pw),
                    "\" y2=\"", y, "\" stroke=\"", color,
                    "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
                    text(left + pw - 6, map_y(l.y) - 6, "end", color, l.label, kHalo));
  }
  absl::StrAppend(&out, "</g>\n<g class=\"series\">\n");

  // Series: a polyline through the usable points in x order, a marker on each, and a legend
  // entry (drawn even when no point is usable).
  std::string legend;
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const Series& s = spec.series[i];
    std::string color = Escape(s.color.empty() ? kPalette[i % std::size(kPalette)] : s.color);
    std::string dash = s.dashed ? " stroke-dasharray=\"7 4\"" : "";
    std::vector<std::pair<double, double>> pts;
    for (auto [x, y] : s.points) {
      if (usable(x, y)) pts.emplace_back(px_x(axis_x(x)), map_y(y));
    }
    std::stable_sort(pts.begin(), pts.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    absl::StrAppend(&out, "<g fill=\"", color, "\" stroke=\"", color, "\">\n");
    if (pts.size() >= 2) {
      absl::StrAppend(&out, "<polyline fill=\"none\" stroke-width=\"2\"", dash, " points=\"");
      for (const auto& [x, y] : pts) absl::StrAppend(&out, Px(x), ",", Px(y), " ");
      out.back() = '"';
      absl::StrAppend(&out, "/>\n");
    }
    for (const auto& [x, y] : pts) {
      absl::StrAppend(&out, "<circle class=\"point\" cx=\"", Px(x), "\" cy=\"", Px(y),
                      "\" r=\"3.5\"/>\n");
    }
    absl::StrAppend(&out, "</g>\n");
    double lx = left + pw + 16, ly = top + 10 + 20 * i;
    absl::StrAppend(&legend, "<line x1=\"", Px(lx), "\" y1=\"", Px(ly), "\" x2=\"", Px(lx + 24),
                    "\" y2=\"", Px(ly), "\" stroke=\"", color, "\" stroke-width=\"2\"", dash,
                    "/>\n<circle cx=\"", Px(lx + 12), "\" cy=\"", Px(ly), "\" r=\"3.5\" fill=\"",
                    color, "\"/>\n", text(lx + 30, ly + 4, "start", "#222", s.label));
  }
  absl::StrAppend(&out, "</g>\n<g class=\"legend\">\n", legend, "</g>\n</svg>\n");
  return out;
}

namespace {

// INVALID_ARGUMENT when `path` is empty or `spec` is smaller than RenderSvg draws it.
absl::Status CheckWritable(absl::string_view what, const PlotSpec& spec, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": path is empty"));
  if (spec.width < kMinSize || spec.height < kMinSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": PlotSpec.width and .height must be >= ", kMinSize, ", got ",
        spec.width, "x", spec.height, spec.title.empty() ? "" : " (panel \"", spec.title,
        spec.title.empty() ? "" : "\")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSvg(const PlotSpec& spec, const std::string& path) {
  RM_RETURN_IF_ERROR(CheckWritable("WriteSvg", spec, path));
  return WriteFileAtomically(path, RenderSvg(spec));
}

std::string RenderPanels(const std::vector<PlotSpec>& panels, int columns) {
  const size_t n = panels.size();
  const size_t cols = std::clamp<size_t>(columns < 1 ? 1 : columns, 1, std::max<size_t>(n, 1));
  const size_t rows = (n + cols - 1) / cols;
  std::vector<int> col_w(cols, n == 0 ? kMinSize : 0), row_h(std::max<size_t>(rows, 1), 0);
  if (n == 0) row_h[0] = kMinSize;
  for (size_t i = 0; i < n; ++i) {
    col_w[i % cols] = std::max(col_w[i % cols], std::max(panels[i].width, kMinSize));
    row_h[i / cols] = std::max(row_h[i / cols], std::max(panels[i].height, kMinSize));
  }
  int width = 0, height = 0;
  for (int w : col_w) width += w;
  for (int h : row_h) height += h;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  int y = 0;
  for (size_t r = 0; r < rows; ++r) {
    int x = 0;
    for (size_t c = 0; c < cols && r * cols + c < n; ++c) {
      // RenderSvg's document starts "<svg xmlns=..."; a nested <svg> takes x and y.
      std::string panel = RenderSvg(panels[r * cols + c]);
      panel.insert(4, absl::StrFormat(" x=\"%d\" y=\"%d\"", x, y));
      absl::StrAppend(&out, panel);
      x += col_w[c];
    }
    y += row_h[r];
  }
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

absl::Status WritePanels(const std::vector<PlotSpec>& panels, int columns,
                         const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("WritePanels: path is empty");
  for (const PlotSpec& panel : panels) RM_RETURN_IF_ERROR(CheckWritable("WritePanels", panel, path));
  return WriteFileAtomically(path, RenderPanels(panels, columns));
}

std::string PaletteColor(size_t i) { return kPalette[i % std::size(kPalette)]; }

}  // namespace ringmaster::plot
