// Line plots as self-contained SVG text, with no plotting dependency: bandwidth against
// message size (ringbench), training curves against steps (ringctl plot), live curves on the
// coordinator's dashboard.
//
// The x axis is log2 (bytes), ticked at powers of two labelled by FormatBytes (the default),
// or linear (PlotSpec::x_scale = XScale::kLinear, e.g. steps); the y axis is linear from 0 to
// a rounded-up maximum, or log10 when PlotSpec::log_y. Points with a non-finite coordinate
// (on the log2 x axis also x <= 0; with log_y also y <= 0) are skipped; an empty or all-zero
// plot still renders axes and legend. Every label is XML-escaped.
//
// Thread-safety: all functions are pure or touch only their own file; call from any thread.
#ifndef RINGMASTER_PLOT_PLOT_H_
#define RINGMASTER_PLOT_PLOT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace ringmaster::plot {

struct Series {
  std::string label;
  // E.g. x = bytes, y = GB/s; or x = step, y = loss. Drawn sorted by x.
  std::vector<std::pair<double, double>> points;
  std::string color;                              // Any SVG colour; empty picks from a palette.
  bool dashed = false;
};

// A reference level across the whole plot, e.g. "loopback TCP limit 3.1 GB/s"; drawn dashed
// with its label at the right end. Counts towards the y range.
struct HorizontalLine {
  std::string label;
  double y = 0;
  std::string color;  // Empty: grey.
};

// A band of x (bytes, or x values on a linear axis) shaded over the full plot height, label at the top, e.g.
// "latency-bound". Clamped to the data's x range (x_min <= 0 means from the left edge);
// does not widen it.
struct Region {
  std::string label;
  double x_min = 0;
  double x_max = 0;
  std::string color;  // Drawn translucent. Empty: grey.
};

// How the x axis maps values: log2 of bytes (ticks at powers of two), or linear.
enum class XScale { kLog2Bytes, kLinear };

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
  std::vector<HorizontalLine> lines;
  std::vector<Region> regions;
  bool log_y = false;
  XScale x_scale = XScale::kLog2Bytes;
  int width = 960;  // Pixels, >= 200.
  int height = 600;
};

// The SVG document for `spec`, starting "<svg" and ending "</svg>\n". Never fails: a
// width or height below 200 is drawn at 200 (WriteSvg rejects it instead).
std::string RenderSvg(const PlotSpec& spec);

// Renders `spec` and writes it to `path` via a temporary file in the same directory, fsync
// and rename, so readers never see a partial file. Blocks on disk I/O.
// INVALID_ARGUMENT: width or height < 200, or an empty path. Otherwise the errno's code
// (NOT_FOUND, PERMISSION_DENIED, ...); every message names `path`.
absl::Status WriteSvg(const PlotSpec& spec, const std::string& path);

// Several plots in one SVG document: each panel is RenderSvg's document nested at its place
// in a grid of `columns` columns (filled row by row; columns < 1 is 1, more columns than
// panels is as many as panels). A column is as wide as its widest panel, a row as high as its
// highest; the document is their sum, white. No panels: an empty white 200x200 document.
// Never fails, like RenderSvg.
std::string RenderPanels(const std::vector<PlotSpec>& panels, int columns);

// RenderPanels written like WriteSvg (temporary file, fsync, rename). INVALID_ARGUMENT: a
// panel's width or height < 200 (the message names the panel's title), or an empty path;
// otherwise the errno's code; every message names `path`.
absl::Status WritePanels(const std::vector<PlotSpec>& panels, int columns,
                         const std::string& path);

// The i-th colour of the palette RenderSvg gives series without one (i wraps around), for
// callers that draw one quantity in the same colour across panels.
std::string PaletteColor(size_t i);

// Bytes with a binary suffix, up to 4 significant digits: 512 -> "512", 1024 -> "1K",
// 1536 -> "1.5K", 1048576 -> "1M", 1073741824 -> "1G" (then T, P).
std::string FormatBytes(double bytes);

}  // namespace ringmaster::plot

#endif  // RINGMASTER_PLOT_PLOT_H_
