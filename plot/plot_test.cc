#include "plot/plot.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringmaster::plot {
namespace {

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

// Well-formed enough: one root, and <g>, <svg>, <text> open as often as they close.
void ExpectWellFormed(const std::string& svg) {
  EXPECT_TRUE(absl::StartsWith(svg, "<svg ")) << svg.substr(0, 80);
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  EXPECT_EQ(Count(svg, "<svg "), 1);
  EXPECT_EQ(Count(svg, "<svg "), Count(svg, "</svg>"));
  EXPECT_EQ(Count(svg, "<g ") + Count(svg, "<g>"), Count(svg, "</g>"));
  EXPECT_EQ(Count(svg, "<text "), Count(svg, "</text>"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

// (cx, cy) of each data marker, in document order.
std::vector<std::pair<double, double>> Points(const std::string& svg) {
  const std::string kMarker = "<circle class=\"point\" cx=\"";
  std::vector<std::pair<double, double>> out;
  for (size_t pos = svg.find(kMarker); pos != std::string::npos; pos = svg.find(kMarker, pos + 1)) {
    char* end = nullptr;
    double cx = std::strtod(svg.c_str() + pos + kMarker.size(), &end);
    EXPECT_TRUE(absl::StartsWith(end, "\" cy=\"")) << svg.substr(pos, 60);
    out.emplace_back(cx, std::strtod(end + 6, nullptr));
  }
  return out;
}

PlotSpec Example() {
  PlotSpec spec;
  spec.title = "allreduce bandwidth, 4 ranks";
  spec.x_label = "message size (bytes)";
  spec.y_label = "bus bandwidth (GB/s)";
  Series ring{"ring", {}, "", false}, tree{"tree", {}, "", true};
  for (int p = 10; p <= 30; p += 2) {
    double x = std::exp2(p);
    ring.points.emplace_back(x, 2.8 * x / (x + 262144.0));
    tree.points.emplace_back(x, 2.2 * x / (x + 65536.0));
  }
  spec.series = {ring, tree};
  spec.lines = {{"loopback TCP limit 3.1 GB/s", 3.1, "#d62728"}};
  spec.regions = {{"latency-bound", 0, 65536, "#9467bd"},
                  {"bandwidth-bound", 4 << 20, 1e300, "#2ca02c"}};
  return spec;
}

TEST(RenderSvg, WellFormedWithEveryLabel) {
  PlotSpec spec = Example();
  std::string svg = RenderSvg(spec);
  ExpectWellFormed(svg);
  for (const char* label :
       {"ring", "tree", "loopback TCP limit 3.1 GB/s", "latency-bound", "bandwidth-bound",
        "allreduce bandwidth, 4 ranks", "message size (bytes)", "bus bandwidth (GB/s)"}) {
    EXPECT_TRUE(absl::StrContains(svg, absl::StrCat(">", label, "</text>"))) << label;
  }
  EXPECT_EQ(Points(svg).size(), 22u);
  EXPECT_TRUE(absl::StrContains(svg, ">1K</text>"));
  EXPECT_TRUE(absl::StrContains(svg, ">1G</text>"));
  spec.log_y = true;
  ExpectWellFormed(RenderSvg(spec));
}

TEST(RenderSvg, EscapesLabels) {
  PlotSpec spec;
  spec.title = "a<b & c>d";
  spec.series = {{"x<y>&z", {{1024, 1}}, "", false}};
  spec.lines = {{"\"quoted\" & 'single'", 1, ""}};
  spec.regions = {{"<region>", 1, 4096, "red\"/><script>"}};
  std::string svg = RenderSvg(spec);
  ExpectWellFormed(svg);
  EXPECT_TRUE(absl::StrContains(svg, "a&lt;b &amp; c&gt;d"));
  EXPECT_TRUE(absl::StrContains(svg, "x&lt;y&gt;&amp;z"));
  EXPECT_TRUE(absl::StrContains(svg, "&quot;quoted&quot; &amp; &apos;single&apos;"));
  EXPECT_TRUE(absl::StrContains(svg, "&lt;region&gt;"));
  EXPECT_FALSE(absl::StrContains(svg, "x<y"));
  EXPECT_FALSE(absl::StrContains(svg, "<script>"));
  EXPECT_FALSE(absl::StrContains(svg, "<region>"));
}

TEST(RenderSvg, LargerYIsHigher) {
  for (bool log_y : {false, true}) {
    PlotSpec spec;
    spec.log_y = log_y;
    spec.series = {{"s", {{1024, 1.0}, {4096, 3.0}}, "", false}};
    auto points = Points(RenderSvg(spec));
    ASSERT_EQ(points.size(), 2u);
    EXPECT_LT(points[0].first, points[1].first);
    EXPECT_LT(points[1].second, points[0].second) << "log_y=" << log_y;
  }
}

TEST(RenderSvg, XIsLog2AndMonotonic) {
  PlotSpec spec;
  // Out of order on purpose: markers come out sorted by x.
  spec.series = {{"s", {{16384, 1}, {1024, 1}, {4096, 1}, {1 << 20, 1}, {3000, 1}}, "", false}};
  auto points = Points(RenderSvg(spec));
  ASSERT_EQ(points.size(), 5u);
  for (size_t i = 1; i < points.size(); ++i) EXPECT_LT(points[i - 1].first, points[i].first);
  // 1K -> 4K and 4K -> 16K are both two powers of two: equal distances.
  double a = points[2].first - points[0].first, b = points[3].first - points[2].first;
  EXPECT_NEAR(a, b, 0.2);
  EXPECT_NEAR(points[4].first - points[3].first, 3 * a, 0.3);  // 16K -> 1M: six powers.
}

TEST(RenderSvg, LinearXIsProportionalAndKeepsZero) {
  PlotSpec spec;
  spec.x_scale = XScale::kLinear;
  spec.title = "loss";
  Series loss{"loss", {{0, 2.3}, {100, 1.1}, {200, 0.7}, {400, 0.5}}, "", false};
  spec.series = {loss};
  std::string svg = RenderSvg(spec);
  ExpectWellFormed(svg);
  std::vector<std::pair<double, double>> pts = Points(svg);
  ASSERT_EQ(pts.size(), 4u);  // x = 0 is a point on a linear axis
  // Equal steps of x are equal steps of pixels: 0 -> 100 -> 200 and 200 -> 400 is twice that.
  const double unit = pts[1].first - pts[0].first;
  EXPECT_GT(unit, 0);
  EXPECT_NEAR(pts[2].first - pts[1].first, unit, 0.2);
  EXPECT_NEAR(pts[3].first - pts[2].first, 2 * unit, 0.2);
  EXPECT_LT(pts[1].second, pts[3].second + 1e9);  // drawn at all
  EXPECT_GT(pts[3].second, pts[0].second);        // a smaller loss is lower
  EXPECT_TRUE(absl::StrContains(svg, ">400<")) << "a tick at the last step";
  EXPECT_FALSE(absl::StrContains(svg, ">1K<")) << "no byte labels on a linear axis";
}

TEST(RenderSvg, CrowdedXAxisSkipsPowers) {
  PlotSpec spec;
  spec.series = {{"s", {{1, 50}, {1 << 20, 100}}, "", false}};  // y ticks: 0, 20, .., 100.
  std::string svg = RenderSvg(spec);  // 21 powers of two in ~840 px: every other one.
  ExpectWellFormed(svg);
  for (const char* shown : {">1<", ">4<", ">16<", ">256<", ">1K<", ">4K<", ">64K<", ">1M<"}) {
    EXPECT_TRUE(absl::StrContains(svg, shown)) << shown;
  }
  for (const char* hidden : {">2<", ">8<", ">512<", ">2K<", ">512K<"}) {
    EXPECT_FALSE(absl::StrContains(svg, hidden)) << hidden;
  }
  spec.width = 400;  // Sparser still, but the labels that remain are powers of two.
  svg = RenderSvg(spec);
  EXPECT_TRUE(absl::StrContains(svg, ">1<"));
  EXPECT_FALSE(absl::StrContains(svg, ">4<"));
  EXPECT_TRUE(absl::StrContains(svg, ">256<"));
}

TEST(RenderSvg, EdgeCases) {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  PlotSpec empty;
  ExpectWellFormed(RenderSvg(empty));

  PlotSpec no_points;
  no_points.series = {{"nothing yet", {}, "", false}};
  std::string svg = RenderSvg(no_points);
  ExpectWellFormed(svg);
  EXPECT_TRUE(absl::StrContains(svg, "nothing yet"));
  EXPECT_TRUE(Points(svg).empty());

  PlotSpec one;
  one.series = {{"one", {{4096, 2.5}}, "", false}};
  svg = RenderSvg(one);
  ExpectWellFormed(svg);
  EXPECT_EQ(Points(svg).size(), 1u);
  EXPECT_FALSE(absl::StrContains(svg, "<polyline"));

  PlotSpec zeros;
  zeros.series = {{"zeros", {{1024, 0}, {2048, 0}}, "", false}};
  ExpectWellFormed(RenderSvg(zeros));
  EXPECT_EQ(Points(RenderSvg(zeros)).size(), 2u);
  zeros.log_y = true;  // y <= 0 cannot be drawn on a log axis.
  ExpectWellFormed(RenderSvg(zeros));
  EXPECT_TRUE(Points(RenderSvg(zeros)).empty());

  PlotSpec bad;
  bad.series = {
      {"bad",
       {{0, 1}, {-8, 1}, {kNan, 1}, {1024, kNan}, {kInf, 1}, {2048, -kInf}, {4096, 1}, {8192, 2}},
       "",
       false}};
  bad.lines = {{"nan line", kNan, ""}};
  bad.regions = {{"nan region", kNan, 1024, ""}};
  svg = RenderSvg(bad);
  ExpectWellFormed(svg);
  EXPECT_EQ(Points(svg).size(), 2u);
  EXPECT_FALSE(absl::StrContains(svg, "nan line"));
  EXPECT_FALSE(absl::StrContains(svg, "nan region"));

  PlotSpec tiny;
  tiny.width = 10;
  tiny.height = -5;
  svg = RenderSvg(tiny);
  ExpectWellFormed(svg);
  EXPECT_TRUE(absl::StrContains(svg, "width=\"200\" height=\"200\""));
}

TEST(FormatBytes, Cases) {
  EXPECT_EQ(FormatBytes(0), "0");
  EXPECT_EQ(FormatBytes(1), "1");
  EXPECT_EQ(FormatBytes(512), "512");
  EXPECT_EQ(FormatBytes(1000), "1000");
  EXPECT_EQ(FormatBytes(1024), "1K");
  EXPECT_EQ(FormatBytes(1536), "1.5K");
  EXPECT_EQ(FormatBytes(65536), "64K");
  EXPECT_EQ(FormatBytes(1048576), "1M");
  EXPECT_EQ(FormatBytes(256 << 20), "256M");
  EXPECT_EQ(FormatBytes(1073741824), "1G");
  EXPECT_EQ(FormatBytes(std::exp2(40)), "1T");
  EXPECT_EQ(FormatBytes(-2048), "-2K");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(WriteSvg, WritesTheRenderedFile) {
  PlotSpec spec = Example();
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/plot.svg");
  ASSERT_TRUE(WriteSvg(spec, path).ok());
  EXPECT_EQ(ReadFile(path), RenderSvg(spec));
  spec.title = "second";
  ASSERT_TRUE(WriteSvg(spec, path).ok());  // Replaces the file.
  EXPECT_EQ(ReadFile(path), RenderSvg(spec));
}

TEST(WriteSvg, ErrorsNameThePath) {
  absl::Status s = WriteSvg(Example(), "/proc/nonexistent/x.svg");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "/proc/nonexistent/x.svg")) << s;

  PlotSpec small = Example();
  small.height = 199;
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/small.svg");
  s = WriteSvg(small, path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "height")) << s;
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_EQ(WriteSvg(Example(), "").code(), absl::StatusCode::kInvalidArgument);
}

// The value of attribute `name` in the first tag of `svg` that starts with `tag`.
double Attribute(const std::string& svg, const std::string& tag, const std::string& name) {
  const size_t at = svg.find(tag);
  EXPECT_NE(at, std::string::npos) << tag;
  const size_t value = svg.find(absl::StrCat(" ", name, "=\""), at);
  EXPECT_LT(value, svg.find('>', at)) << name << " in " << svg.substr(at, 120);
  return std::strtod(svg.c_str() + value + name.size() + 3, nullptr);
}

PlotSpec Panel(const std::string& title, int width, int height, int points) {
  PlotSpec spec;
  spec.title = title;
  spec.x_scale = XScale::kLinear;
  spec.width = width;
  spec.height = height;
  Series s{title, {}, "", false};
  for (int i = 0; i < points; ++i) s.points.emplace_back(i, 1.0 / (i + 1));
  spec.series = {s};
  return spec;
}

TEST(RenderPanels, NestsEachPanelAtItsPlaceInTheGrid) {
  // Two columns: widths 300 | 500 (the widest of each column), heights 250 (row 0) + 400.
  const std::vector<PlotSpec> panels = {Panel("a", 300, 250, 3), Panel("b", 500, 220, 4),
                                        Panel("c", 260, 400, 5)};
  const std::string svg = RenderPanels(panels, 2);
  EXPECT_TRUE(absl::StartsWith(svg, "<svg ")) << svg.substr(0, 80);
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  EXPECT_EQ(Count(svg, "<svg "), 4);  // the document and three panels
  EXPECT_EQ(Count(svg, "</svg>"), 4);
  EXPECT_EQ(Count(svg, "<g ") + Count(svg, "<g>"), Count(svg, "</g>"));
  EXPECT_EQ(Attribute(svg, "<svg ", "width"), 800);
  EXPECT_EQ(Attribute(svg, "<svg ", "height"), 650);
  // Each panel is RenderSvg's document, placed by x and y.
  const std::vector<std::pair<int, int>> places = {{0, 0}, {300, 0}, {0, 250}};
  for (size_t i = 0; i < panels.size(); ++i) {
    std::string alone = RenderSvg(panels[i]);
    const std::string tag = absl::StrCat("<svg x=\"", places[i].first, "\" y=\"",
                                         places[i].second, "\"", alone.substr(4));
    EXPECT_TRUE(absl::StrContains(svg, tag)) << "panel " << panels[i].title;
  }
  EXPECT_EQ(Points(svg).size(), 3u + 4u + 5u);
}

TEST(RenderPanels, ColumnsAreClampedAndNoPanelsIsBlank) {
  const std::vector<PlotSpec> panels = {Panel("a", 300, 250, 1), Panel("b", 300, 250, 1)};
  // One column: stacked. Columns beyond the panels: one row. Zero columns: one column.
  EXPECT_EQ(Attribute(RenderPanels(panels, 1), "<svg ", "height"), 500);
  EXPECT_EQ(Attribute(RenderPanels(panels, 7), "<svg ", "width"), 600);
  EXPECT_EQ(Attribute(RenderPanels(panels, 7), "<svg ", "height"), 250);
  EXPECT_EQ(RenderPanels(panels, 0), RenderPanels(panels, 1));
  const std::string blank = RenderPanels({}, 2);
  EXPECT_EQ(Count(blank, "<svg "), 1);
  EXPECT_EQ(Attribute(blank, "<svg ", "width"), 200);
  EXPECT_EQ(Attribute(blank, "<svg ", "height"), 200);
}

TEST(WritePanels, WritesTheDocumentOrNamesTheSmallPanel) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/panels.svg");
  std::vector<PlotSpec> panels = {Panel("loss", 300, 250, 2), Panel("lr", 300, 250, 2)};
  ASSERT_TRUE(WritePanels(panels, 2, path).ok());
  EXPECT_EQ(ReadFile(path), RenderPanels(panels, 2));
  panels[1].width = 150;
  const absl::Status s = WritePanels(panels, 2, path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "\"lr\"")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_EQ(WritePanels(panels, 2, "").code(), absl::StatusCode::kInvalidArgument);
}

TEST(PaletteColor, IsTheDefaultSeriesColourAndWraps) {
  PlotSpec spec = Panel("x", 400, 300, 2);
  spec.series.push_back(spec.series[0]);
  const std::string svg = RenderSvg(spec);
  EXPECT_TRUE(absl::StrContains(svg, absl::StrCat("<g fill=\"", PaletteColor(1), "\"")));
  EXPECT_NE(PaletteColor(0), PaletteColor(1));
  EXPECT_EQ(PaletteColor(0), PaletteColor(10));
}

}  // namespace
}  // namespace ringmaster::plot
