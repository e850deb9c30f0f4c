#include "roofline/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace ekva {
namespace {

constexpr double kWidth = 900;
constexpr double kHeight = 600;
constexpr double kLeft = 90;
constexpr double kRight = 40;
constexpr double kTop = 50;
constexpr double kBottom = 60;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

class LogAxes {
 public:
  LogAxes(double x_min, double x_max, double y_min, double y_max)
      : lx0_(std::floor(std::log10(x_min))),
        lx1_(std::ceil(std::log10(x_max))),
        ly0_(std::floor(std::log10(y_min))),
        ly1_(std::ceil(std::log10(y_max))) {}
  double x(double v) const {
    return kLeft + (std::log10(v) - lx0_) / (lx1_ - lx0_) * (kWidth - kLeft - kRight);
  }
  double y(double v) const {
    return kHeight - kBottom - (std::log10(v) - ly0_) / (ly1_ - ly0_) * (kHeight - kTop - kBottom);
  }
  double x_min() const { return std::pow(10.0, lx0_); }
  double x_max() const { return std::pow(10.0, lx1_); }
  int x_decades() const { return static_cast<int>(lx1_ - lx0_); }
  int y_decades() const { return static_cast<int>(ly1_ - ly0_); }
  double lx0() const { return lx0_; }
  double ly0() const { return ly0_; }

 private:
  double lx0_, lx1_, ly0_, ly1_;
};

std::string si(double v) {
  const char* units[] = {"", "k", "M", "G", "T", "P", "E"};
  int u = 0;
  while (v >= 1000 && u < 6) {
    v /= 1000;
    ++u;
  }
  return fmt::format("{:g}{}", v, units[u]);
}

}  // namespace

std::string roofline_svg(const std::string& title, const Ceilings& ceilings,
                         PeakFormat compute_format, const std::vector<ChartPoint>& points) {
  const double bandwidth = ceilings.read_bandwidth;
  const double peak = ceilings.peak(compute_format);
  const double fp32_peak = ceilings.peak(PeakFormat::kFP32);
  const double ridge = peak / bandwidth;
  std::vector<ChartPoint> shown;
  for (const auto& p : points) {
    if (p.intensity > 0 && p.flops_per_s > 0) shown.push_back(p);
  }
  double x_min = ridge / 100, x_max = ridge * 10, y_min = peak / 1e4;
  for (const auto& p : shown) {
    x_min = std::min(x_min, p.intensity / 2);
    x_max = std::max(x_max, p.intensity * 2);
    y_min = std::min(y_min, p.flops_per_s / 2);
  }
  const LogAxes ax(x_min, x_max, y_min, peak * 2);

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"28\" font-size=\"16\">{3}</text>\n",
      kWidth, kHeight, kLeft, escape(title));
  for (int i = 0; i <= ax.x_decades(); ++i) {
    const double v = std::pow(10.0, ax.lx0() + i);
    const double x = ax.x(v);
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x, kTop, kHeight - kBottom, kHeight - kBottom + 18, si(v));
  }
  for (int i = 0; i <= ax.y_decades(); ++i) {
    const double v = std::pow(10.0, ax.ly0() + i);
    const double y = ax.y(v);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        kLeft, y, kWidth - kRight, kLeft - 6, y + 4, si(v));
  }
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arithmetic intensity (FLOP/byte)</text>\n"
      "<text x=\"20\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {})\">"
      "attained FLOP/s</text>\n",
      (kLeft + kWidth - kRight) / 2, kHeight - 15, (kTop + kHeight - kBottom) / 2,
      (kTop + kHeight - kBottom) / 2);
  const auto roof = [&](double p, const char* colour, const char* dash, const std::string& label) {
    const double knee = p / bandwidth;
    const double x0 = ax.x_min();
    s += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" {} points=\"{:.1f},{:.1f} "
        "{:.1f},{:.1f} {:.1f},{:.1f}\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"{}\">{}</text>\n",
        colour, dash, ax.x(x0), ax.y(x0 * bandwidth), ax.x(knee), ax.y(p), ax.x(ax.x_max()),
        ax.y(p), ax.x(ax.x_max()) - 4, ax.y(p) - 6, colour, escape(label));
  };
  roof(peak, "#c0392b", "",
       fmt::format("{} peak {}FLOP/s, {}B/s read",
                   peak_format_name(ceilings.effective_format(compute_format)), si(peak),
                   si(bandwidth)));
  if (fp32_peak < peak) {
    roof(fp32_peak, "#7f8c8d", "stroke-dasharray=\"6 4\"",
         fmt::format("fp32 peak {}FLOP/s", si(fp32_peak)));
  }
  for (const auto& p : shown) {
    const double x = ax.x(p.intensity);
    const double y = ax.y(p.flops_per_s);
    s += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\" stroke=\"#2c3e50\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n",
        x, y, p.measured ? "white" : "#2980b9", x + 7, y - 5, escape(p.label));
  }
  s += "</svg>\n";
  return s;
}

}  // namespace ekva
