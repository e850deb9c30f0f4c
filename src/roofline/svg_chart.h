#pragma once
// A roofline chart (log-log: arithmetic intensity against attained FLOP/s) with one point per
// operator, as standalone SVG text.
#include <string>
#include <vector>

#include "roofline/cost_model.h"

namespace ekva {

struct ChartPoint {
  std::string label;
  double intensity = 0;  // FLOP per byte
  double flops_per_s = 0;
  bool measured = false;  // drawn hollow
};

// Points with zero FLOPs or time are left out (a log axis has no zero).
std::string roofline_svg(const std::string& title, const Ceilings& ceilings,
                         PeakFormat compute_format, const std::vector<ChartPoint>& points);

}  // namespace ekva
