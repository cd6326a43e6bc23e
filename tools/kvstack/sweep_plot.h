// gnuplot output of `kvstack sweep`: a scatter plot of loss against memory with its Pareto
// frontier (the codec and policy grids) and a line plot of one value per segment (streaming),
// each written as PREFIX.png and PREFIX.svg.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kvstack/status.h"

namespace kvstack::cli {

// FailedPrecondition (one line, with the Debian package) when gnuplot is not on PATH.
absl::Status CheckGnuplot();

struct ScatterPlot {
  std::string title, xlabel, ylabel;
  std::vector<double> x, y;         // [points]; y may span orders of magnitude (log axis)
  std::vector<std::string> labels;  // [points]
  std::vector<int> frontier;        // indices of the points on the frontier, in x order
};
absl::Status WriteScatterPlot(const std::string& prefix, const ScatterPlot& plot);

struct LinePlot {
  std::string title, xlabel, ylabel;
  std::vector<double> x;                                            // [points]
  std::vector<std::pair<std::string, std::vector<double>>> series;  // name, [points]
};
absl::Status WriteLinePlot(const std::string& prefix, const LinePlot& plot);

}  // namespace kvstack::cli
