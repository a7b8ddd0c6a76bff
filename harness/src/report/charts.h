#pragma once
#include <string>
#include <vector>

#include "summary.h"

namespace chiar::report {

struct Chart {
  std::string title;
  std::string file;  // SVG, beside the report
  std::string caption;
};

// Draws every chart with gnuplot into out_dir, files named <prefix>-<what>.svg.
// Reads only the store. Throws UserError when gnuplot is missing.
std::vector<Chart> draw_charts(const Summary& s, const std::string& out_dir, const std::string& prefix,
                               const std::string& baseline);

// The colour of a variant, the same in every chart and table.
std::string variant_colour(const Summary& s, const std::string& variant);

// How an operator's points look in the routing charts: from its place in the
// registry, so the same operator has the same points in every chart.
struct OperatorPoint {
  int type;           // gnuplot's `pt`
  const char* shape;  // for captions, e.g. "circles"
};
OperatorPoint operator_point(const OperatorCatalog& operators, const std::string& op);

}  // namespace chiar::report
