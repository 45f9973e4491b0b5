// Hand-written SVG for the memory report: a tiny document builder and the two plots `trainer report`
// draws. No dependencies, no LibTorch: the output is plain SVG 1.1 that browsers and GitHub render.
//
//   stacked_timeline_svg   one panel per rank (<g class="panel" id="rank-R">): a bar per timeline point
//                          of one step, stacked by category (<rect class="bar CATEGORY">), and the
//                          allocator's peak of the point's window (<line class="window-peak">)
//   peak_per_rank_svg      grouped bars: one group per run, one bar per rank (<rect class="bar peak">),
//                          and the estimate as a dashed line over its group (<line class="estimate">)
//   share_bars_svg         the techniques report: per section (<g class="section">) a row per run
//                          (<g class="row">) with its peak as a share of the baseline's
//                          (<rect class="bar peak-share">) and its tokens/s as one (<rect class="bar
//                          speed-share">)
//   line_plot_svg          the context-length sweep: bytes over a log2 x axis, a polyline of
//                          segments per series (<g class="series">, <line class="segment">), a
//                          marker per point (<rect class="marker">)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/categories.h"

namespace llm {

// Escapes &, <, >, " and ' for text and attribute values.
std::string xml_escape(const std::string& text);

class SvgDocument {
 public:
  SvgDocument(double width, double height);
  void open_group(const std::string& attributes);  // raw attributes, e.g. class="panel" id="rank-0"
  void close_group();
  void rect(double x, double y, double width, double height, const std::string& fill,
            const std::string& css_class, const std::string& tooltip = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double stroke_width,
            const std::string& css_class, const std::string& dash = "");
  // anchor: start, middle or end; rotate: degrees around (x, y).
  void text(double x, double y, const std::string& content, double size = 11, const std::string& anchor = "start",
            double rotate = 0, const std::string& css_class = "");
  std::string str() const;

 private:
  double width_, height_;
  std::string body_;
  int open_groups_ = 0;
};

// The fill colour of each category (index as in MemoryCategories::at).
const std::string& category_color(int index);

struct TimelineBar {
  std::string label;  // "forward:layer.0"
  MemoryCategories categories;
  int64_t window_peak_bytes = 0;
};
struct RankTimeline {
  int rank = 0;
  std::vector<TimelineBar> bars;
};
std::string stacked_timeline_svg(const std::string& title, const std::vector<RankTimeline>& ranks);

struct RunPeaks {
  std::string label;
  std::vector<int64_t> peak_per_rank;
  int64_t estimate_bytes = 0;  // 0: none
};
std::string peak_per_rank_svg(const std::string& title, const std::vector<RunPeaks>& runs);

struct ShareRow {
  std::string label;
  double peak_share = 0;   // of the section's baseline, 1 = 100 %
  double speed_share = 0;  // tokens/s, of the baseline's
  int64_t peak_bytes = 0;
};
struct ShareSection {
  std::string title;  // "1 rank"
  std::vector<ShareRow> rows;
};
std::string share_bars_svg(const std::string& title, const std::vector<ShareSection>& sections);

struct PlotSeries {
  std::string label;
  std::string color;
  bool dashed = false;
  std::vector<std::pair<double, int64_t>> points;  // (x, bytes), x > 0, in increasing x
};
std::string line_plot_svg(const std::string& title, const std::string& x_label, const std::vector<PlotSeries>& series);

}  // namespace llm
