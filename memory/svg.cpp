#include "memory/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace llm {
namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

// A "nice" step for about `ticks` ticks up to `largest`: 1, 2 or 5 times a power of ten.
double nice_step(double largest, int ticks) {
  if (largest <= 0) return 1;
  const double raw = largest / ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0, 10.0})
    if (raw <= factor * magnitude) return factor * magnitude;
  return 10 * magnitude;
}

constexpr double kLeft = 78, kRight = 24, kTitle = 28, kLegend = 26;

void legend(SvgDocument& svg, double x, double y) {
  for (int i = 0; i < MemoryCategories::kCount; ++i) {
    svg.open_group("class=\"legend-entry\"");
    svg.rect(x, y - 9, 10, 10, category_color(i), "legend " + std::string(MemoryCategories::keys()[i]));
    svg.text(x + 14, y, MemoryCategories::titles()[i], 11);
    svg.close_group();
    x += 24 + 7.0 * static_cast<double>(std::string(MemoryCategories::titles()[i]).size());
  }
}

// Horizontal grid lines and labels of a y axis from 0 to `top` bytes in `unit`, on [y0 - height, y0].
void y_axis(SvgDocument& svg, double x0, double x1, double y0, double height, double top, const ByteUnit& unit) {
  const double step_in_unit = nice_step(top / unit.divisor, 4);
  const double step = step_in_unit * unit.divisor;
  const int decimals = step_in_unit >= 1 ? 0 : step_in_unit >= 0.1 ? 1 : 2;
  for (double value = 0; value <= top * 1.0001; value += step) {
    const double y = y0 - height * value / top;
    svg.line(x0, y, x1, y, "#dddddd", 1, "grid");
    char label[48];
    std::snprintf(label, sizeof(label), "%.*f %s", decimals, value / unit.divisor, unit.name);
    svg.text(x0 - 6, y + 4, label, 10, "end");
  }
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

SvgDocument::SvgDocument(double width, double height) : width_(width), height_(height) {}

void SvgDocument::open_group(const std::string& attributes) {
  body_ += "<g " + attributes + ">\n";
  ++open_groups_;
}

void SvgDocument::close_group() {
  if (open_groups_ == 0) return;
  body_ += "</g>\n";
  --open_groups_;
}

void SvgDocument::rect(double x, double y, double width, double height, const std::string& fill,
                       const std::string& css_class, const std::string& tooltip) {
  body_ += "<rect class=\"" + xml_escape(css_class) + "\" x=\"" + number(x) + "\" y=\"" + number(y) +
           "\" width=\"" + number(std::max(0.0, width)) + "\" height=\"" + number(std::max(0.0, height)) +
           "\" fill=\"" + xml_escape(fill) + "\"";
  if (tooltip.empty())
    body_ += "/>\n";
  else
    body_ += "><title>" + xml_escape(tooltip) + "</title></rect>\n";
}

void SvgDocument::line(double x1, double y1, double x2, double y2, const std::string& stroke, double stroke_width,
                       const std::string& css_class, const std::string& dash) {
  body_ += "<line class=\"" + xml_escape(css_class) + "\" x1=\"" + number(x1) + "\" y1=\"" + number(y1) +
           "\" x2=\"" + number(x2) + "\" y2=\"" + number(y2) + "\" stroke=\"" + xml_escape(stroke) +
           "\" stroke-width=\"" + number(stroke_width) + "\"";
  if (!dash.empty()) body_ += " stroke-dasharray=\"" + xml_escape(dash) + "\"";
  body_ += "/>\n";
}

void SvgDocument::text(double x, double y, const std::string& content, double size, const std::string& anchor,
                       double rotate, const std::string& css_class) {
  body_ += "<text x=\"" + number(x) + "\" y=\"" + number(y) + "\" font-size=\"" + number(size) +
           "\" text-anchor=\"" + xml_escape(anchor) + "\"";
  if (!css_class.empty()) body_ += " class=\"" + xml_escape(css_class) + "\"";
  if (rotate != 0) body_ += " transform=\"rotate(" + number(rotate) + " " + number(x) + " " + number(y) + ")\"";
  body_ += ">" + xml_escape(content) + "</text>\n";
}

std::string SvgDocument::str() const {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    number(width_) + "\" height=\"" + number(height_) + "\" viewBox=\"0 0 " + number(width_) + " " +
                    number(height_) + "\" font-family=\"sans-serif\">\n<rect class=\"background\" x=\"0\" y=\"0\" width=\"" +
                    number(width_) + "\" height=\"" + number(height_) + "\" fill=\"white\"/>\n";
  out += body_;
  for (int i = 0; i < open_groups_; ++i) out += "</g>\n";
  out += "</svg>\n";
  return out;
}

const std::string& category_color(int index) {
  static const std::string colors[MemoryCategories::kCount] = {"#4e79a7", "#f28e2b", "#59a14f",
                                                               "#76b7b2", "#e15759", "#bab0ac"};
  return colors[std::clamp(index, 0, MemoryCategories::kCount - 1)];
}

std::string stacked_timeline_svg(const std::string& title, const std::vector<RankTimeline>& ranks) {
  size_t points = 0;
  double top = 1;
  for (const RankTimeline& rank : ranks) {
    points = std::max(points, rank.bars.size());
    for (const TimelineBar& bar : rank.bars) {
      int64_t stacked = 0;
      for (int i = 0; i < MemoryCategories::kCount; ++i) stacked += std::max<int64_t>(0, bar.categories.at(i));
      top = std::max({top, static_cast<double>(stacked), static_cast<double>(bar.window_peak_bytes)});
    }
  }
  top *= 1.05;
  const ByteUnit unit = byte_unit_for(static_cast<int64_t>(top));
  const double bar_width = std::clamp(640.0 / std::max<size_t>(points, 1), 6.0, 22.0);
  const double slot = bar_width * 1.3;
  const double plot_width = slot * static_cast<double>(std::max<size_t>(points, 1));
  const double panel_height = 150, panel_gap = 36, labels = 118;
  const double width = std::max(kLeft + plot_width + kRight, 720.0);
  const double height = kTitle + kLegend + static_cast<double>(ranks.size()) * (panel_height + panel_gap) + labels;
  SvgDocument svg(width, height);
  svg.text(kLeft, 18, title, 14, "start", 0, "title");
  legend(svg, kLeft, kTitle + 14);

  double y_top = kTitle + kLegend + 10;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankTimeline& rank = ranks[r];
    const double y0 = y_top + panel_height;
    svg.open_group("class=\"panel\" id=\"rank-" + std::to_string(rank.rank) + "\"");
    svg.text(kLeft + plot_width + 4, y_top + 10, "rank " + std::to_string(rank.rank), 11, "end", 0, "panel-title");
    y_axis(svg, kLeft, kLeft + plot_width, y0, panel_height, top, unit);
    for (size_t p = 0; p < rank.bars.size(); ++p) {
      const TimelineBar& bar = rank.bars[p];
      const double x = kLeft + slot * static_cast<double>(p) + (slot - bar_width) / 2;
      double y = y0;
      for (int i = 0; i < MemoryCategories::kCount; ++i) {
        const int64_t bytes = std::max<int64_t>(0, bar.categories.at(i));
        if (bytes == 0) continue;
        const double h = panel_height * static_cast<double>(bytes) / top;
        svg.rect(x, y - h, bar_width, h, category_color(i), std::string("bar ") + MemoryCategories::keys()[i],
                 bar.label + ": " + MemoryCategories::titles()[i] + " " + human_bytes(bytes));
        y -= h;
      }
      const double peak_y = y0 - panel_height * static_cast<double>(bar.window_peak_bytes) / top;
      svg.line(x - 1, peak_y, x + bar_width + 1, peak_y, "#000000", 2, "window-peak");
      if (r + 1 == ranks.size())
        svg.text(x + bar_width / 2, y0 + 10, bar.label, 9, "end", -60, "point-label");
    }
    svg.line(kLeft, y0, kLeft + plot_width, y0, "#333333", 1, "axis");
    svg.close_group();
    y_top += panel_height + panel_gap;
  }
  svg.text(kLeft, height - 6,
           "Bars: the categories at each timeline point of the step; black ticks: the allocator's peak "
           "since the previous point.",
           10, "start", 0, "caption");
  return svg.str();
}

std::string peak_per_rank_svg(const std::string& title, const std::vector<RunPeaks>& runs) {
  double top = 1;
  size_t bars = 0;
  for (const RunPeaks& run : runs) {
    bars += run.peak_per_rank.size();
    for (int64_t peak : run.peak_per_rank) top = std::max(top, static_cast<double>(peak));
    top = std::max(top, static_cast<double>(run.estimate_bytes));
  }
  top *= 1.08;
  const ByteUnit unit = byte_unit_for(static_cast<int64_t>(top));
  // Run labels are written at -40 degrees under their group: the first ones need room on the left.
  size_t longest = 0;
  for (const RunPeaks& run : runs) longest = std::max(longest, run.label.size());
  const double label_run = 5.6 * static_cast<double>(longest);
  const double left = std::max(kLeft, 0.77 * label_run - 10);
  const double bar_width = 12, group_gap = 22;
  const double plot_width = bar_width * static_cast<double>(bars) + group_gap * static_cast<double>(runs.size() + 1);
  const double plot_height = 260, labels = 0.64 * label_run + 40;
  const double width = std::max(left + plot_width + kRight, 480.0);
  const double height = kTitle + 20 + plot_height + labels;
  SvgDocument svg(width, height);
  svg.text(left, 18, title, 14, "start", 0, "title");
  const double y0 = kTitle + 20 + plot_height;
  y_axis(svg, left, left + plot_width, y0, plot_height, top, unit);
  double x = left + group_gap;
  for (const RunPeaks& run : runs) {
    svg.open_group("class=\"run\"");
    const double group_start = x;
    for (size_t r = 0; r < run.peak_per_rank.size(); ++r) {
      const double h = plot_height * static_cast<double>(run.peak_per_rank[r]) / top;
      svg.rect(x, y0 - h, bar_width - 2, h, r % 2 == 0 ? "#4e79a7" : "#7fa3c7", "bar peak",
               run.label + ", rank " + std::to_string(r) + ": " + human_bytes(run.peak_per_rank[r]));
      x += bar_width;
    }
    if (run.estimate_bytes > 0) {
      const double y = y0 - plot_height * static_cast<double>(run.estimate_bytes) / top;
      svg.line(group_start - 3, y, x + 1, y, "#e15759", 2, "estimate", "4 2");
    }
    svg.text((group_start + x) / 2, y0 + 10, run.label, 10, "end", -40, "run-label");
    svg.close_group();
    x += group_gap;
  }
  svg.line(left, y0, left + plot_width, y0, "#333333", 1, "axis");
  svg.text(8, height - 6, "Bars: each rank's measured peak; red dashes: the estimate (trainer estimate).", 10,
           "start", 0, "caption");
  return svg.str();
}

std::string share_bars_svg(const std::string& title, const std::vector<ShareSection>& sections) {
  double top = 1.0;  // 100 %
  size_t rows = 0, longest = 0;
  for (const ShareSection& section : sections) {
    rows += section.rows.size();
    for (const ShareRow& row : section.rows) {
      top = std::max({top, row.peak_share, row.speed_share});
      longest = std::max(longest, row.label.size());
    }
  }
  top = std::ceil(top * 1.05 * 4) / 4;  // a multiple of 25 %
  const double left = std::max(120.0, 6.2 * static_cast<double>(longest) + 16), plot_width = 420;
  const double row_height = 26, section_head = 24, legend_height = 22;
  const double plot_top = kTitle + legend_height + 18;
  const double height = plot_top + row_height * static_cast<double>(rows) + section_head * static_cast<double>(sections.size()) + 30;
  const double width = left + plot_width + 110;
  SvgDocument svg(width, height);
  svg.text(8, 18, title, 14, "start", 0, "title");
  const double legend_y = kTitle + 12;
  svg.rect(left, legend_y - 9, 10, 10, "#4e79a7", "legend peak-share");
  svg.text(left + 14, legend_y, "peak memory per rank, share of the baseline's", 11);
  svg.rect(left + 280, legend_y - 9, 10, 10, "#f28e2b", "legend speed-share");
  svg.text(left + 294, legend_y, "tokens/s, share of the baseline's", 11);
  const double bottom = height - 30;
  for (double value = 0; value <= top + 1e-9; value += 0.25) {
    const double x = left + plot_width * value / top;
    svg.line(x, plot_top - 4, x, bottom, value == 1.0 ? "#999999" : "#e4e4e4", 1, value == 1.0 ? "grid baseline" : "grid");
    char label[16];
    std::snprintf(label, sizeof(label), "%.0f %%", 100 * value);
    svg.text(x, bottom + 14, label, 10, "middle");
  }
  double y = plot_top;
  for (const ShareSection& section : sections) {
    svg.open_group("class=\"section\"");
    svg.text(8, y + 14, section.title, 12, "start", 0, "section-title");
    y += section_head;
    for (const ShareRow& row : section.rows) {
      svg.open_group("class=\"row\"");
      svg.text(left - 8, y + 14, row.label, 11, "end", 0, "row-label");
      const double peak_width = plot_width * row.peak_share / top;
      const double speed_width = plot_width * row.speed_share / top;
      char share[64];
      std::snprintf(share, sizeof(share), "%.1f %%", 100 * row.peak_share);
      svg.rect(left, y + 3, peak_width, 11, "#4e79a7", "bar peak-share",
               row.label + ": peak " + human_bytes(row.peak_bytes) + ", " + share + " of the baseline's");
      svg.text(left + peak_width + 4, y + 12, std::string(share) + " (" + human_bytes(row.peak_bytes) + ")", 9);
      std::snprintf(share, sizeof(share), "%.1f %%", 100 * row.speed_share);
      svg.rect(left, y + 15, speed_width, 7, "#f28e2b", "bar speed-share",
               row.label + ": tokens/s " + share + " of the baseline's");
      svg.close_group();
      y += row_height;
    }
    svg.close_group();
  }
  svg.line(left, plot_top - 4, left, bottom, "#333333", 1, "axis");
  return svg.str();
}

std::string line_plot_svg(const std::string& title, const std::string& x_label, const std::vector<PlotSeries>& series) {
  double x_min = 0, x_max = 0, top = 1;
  bool any = false;
  for (const PlotSeries& line : series)
    for (const auto& [x, bytes] : line.points) {
      x_min = any ? std::min(x_min, x) : x;
      x_max = any ? std::max(x_max, x) : x;
      top = std::max(top, static_cast<double>(bytes));
      any = true;
    }
  if (!any) x_min = x_max = 1;
  top *= 1.08;
  const ByteUnit unit = byte_unit_for(static_cast<int64_t>(top));
  const double log_min = std::log2(std::max(x_min, 1e-9)), log_max = std::max(std::log2(std::max(x_max, 1e-9)), log_min + 1);
  const double plot_width = 460, plot_height = 280, legend_width = 250;
  const double width = kLeft + plot_width + legend_width, height = kTitle + 20 + plot_height + 50;
  SvgDocument svg(width, height);
  svg.text(kLeft, 18, title, 14, "start", 0, "title");
  const double y0 = kTitle + 20 + plot_height;
  y_axis(svg, kLeft, kLeft + plot_width, y0, plot_height, top, unit);
  auto x_at = [&](double x) { return kLeft + 10 + (plot_width - 20) * (std::log2(x) - log_min) / (log_max - log_min); };
  auto y_at = [&](int64_t bytes) { return y0 - plot_height * static_cast<double>(bytes) / top; };
  std::vector<double> ticks;
  for (const PlotSeries& line : series)
    for (const auto& point : line.points) ticks.push_back(point.first);
  std::sort(ticks.begin(), ticks.end());
  ticks.erase(std::unique(ticks.begin(), ticks.end()), ticks.end());
  for (double x : ticks) {
    char label[32];
    std::snprintf(label, sizeof(label), "%g", x);
    svg.line(x_at(x), y0, x_at(x), y0 + 4, "#333333", 1, "tick");
    svg.text(x_at(x), y0 + 16, label, 10, "middle");
  }
  svg.text(kLeft + plot_width / 2, y0 + 36, x_label, 11, "middle", 0, "axis-label");
  svg.line(kLeft, y0, kLeft + plot_width, y0, "#333333", 1, "axis");
  double legend_y = kTitle + 30;
  for (const PlotSeries& line : series) {
    svg.open_group("class=\"series\"");
    const std::string dash = line.dashed ? "5 3" : "";
    for (size_t i = 1; i < line.points.size(); ++i)
      svg.line(x_at(line.points[i - 1].first), y_at(line.points[i - 1].second), x_at(line.points[i].first),
               y_at(line.points[i].second), line.color, 2, "segment", dash);
    for (const auto& [x, bytes] : line.points) {
      char tip[64];
      std::snprintf(tip, sizeof(tip), "%g: ", x);
      const double size = line.dashed ? 4 : 7;  // estimated points smaller, so both show where they meet
      svg.rect(x_at(x) - size / 2, y_at(bytes) - size / 2, size, size, line.color, "marker",
               line.label + " at " + tip + human_bytes(bytes));
    }
    svg.line(kLeft + plot_width + 16, legend_y - 4, kLeft + plot_width + 40, legend_y - 4, line.color, 2, "legend", dash);
    svg.text(kLeft + plot_width + 46, legend_y, line.label, 11);
    svg.close_group();
    legend_y += 18;
  }
  return svg.str();
}

}  // namespace llm
