// The gnuplot scripts behind sweep_plot.h. Label placement keeps the labels of crowded
// configurations readable; the scripts run in a temporary directory that is kept (and named)
// only when gnuplot fails.
#include "sweep_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace kvstack::cli {
namespace {

// A gnuplot single-quoted string: only the quote itself needs escaping (by doubling).
std::string GnuplotQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

// Where a point's label starts (it is always left-aligned: gnuplot right-aligns with the
// default font's metrics, which misplaces smaller label text), as an offset from the point in
// graph units (0..1 across the plot area).
struct LabelPlacement {
  double dx = 0, dy = 0;
};

// Greedy placement that keeps labels of nearby configurations (several codecs often share a
// bit width) from printing over each other or over other points: the labels of the most
// crowded points are placed first, each at the first of sixteen positions around its point
// (right, then left, nearest rows first) that overlaps nothing placed so far, else at the
// least overlapping one. gx, gy: [num_points] positions in graph units; chars: label lengths.
std::vector<LabelPlacement> PlaceLabels(const std::vector<double>& gx,
                                        const std::vector<double>& gy,
                                        const std::vector<int>& chars) {
  // At the plot's size (1000 x 650, font 8) a character is ~0.0055 of the plot area's width
  // and a line ~0.024 of its height; a point is ~0.01 across.
  constexpr double kCharW = 0.0058, kLineH = 0.024, kPoint = 0.01;
  struct Box {
    double x0, x1, y0, y1;
  };
  auto overlap = [](const Box& a, const Box& b) {
    const double w = std::min(a.x1, b.x1) - std::max(a.x0, b.x0);
    const double h = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
    return w > 0 && h > 0 ? w * h : 0.0;
  };
  std::vector<Box> taken;
  for (size_t i = 0; i < gx.size(); ++i) {
    taken.push_back({gx[i] - kPoint, gx[i] + kPoint, gy[i] - kPoint, gy[i] + kPoint});
  }
  // Candidate positions: dx > 0 starts the label right of the point, dx < 0 ends it left of
  // the point.
  std::vector<LabelPlacement> candidates;
  for (double dy : {0.012, -0.022, 0.038, -0.048, 0.064, -0.074, 0.090, -0.100}) {
    candidates.push_back({0.012, dy});
    candidates.push_back({-0.012, dy});
  }
  std::vector<int> crowding(gx.size(), 0);
  for (size_t i = 0; i < gx.size(); ++i) {
    for (size_t j = 0; j < gx.size(); ++j) {
      crowding[i] += std::abs(gx[i] - gx[j]) < 0.15 && std::abs(gy[i] - gy[j]) < 0.08;
    }
  }
  std::vector<size_t> order(gx.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return crowding[a] > crowding[b]; });
  std::vector<LabelPlacement> placements(gx.size());
  for (size_t i : order) {
    double best_cost = INFINITY;
    Box best_box{};
    for (const LabelPlacement& c : candidates) {
      const double w = chars[i] * kCharW;
      const double start_dx = c.dx > 0 ? c.dx : c.dx - w;
      const double x0 = gx[i] + start_dx;
      const Box box{x0, x0 + w, gy[i] + c.dy - kLineH / 2, gy[i] + c.dy + kLineH / 2};
      double cost = 0;
      for (size_t j = 0; j < taken.size(); ++j) {
        if (j != i) cost += overlap(box, taken[j]);
      }
      if (box.x0 < 0 || box.x1 > 1) cost += 1;  // outside the plot area
      if (cost < best_cost) {
        best_cost = cost;
        best_box = box;
        placements[i] = {start_dx, c.dy};
      }
      if (cost == 0) break;
    }
    taken.push_back(best_box);
  }
  return placements;
}

// A fresh temporary directory for one gnuplot run.
absl::StatusOr<std::filesystem::path> MakeTempDir() {
  std::error_code ec;
  std::string dir_template = (std::filesystem::temp_directory_path(ec) / "kvstack-sweep-XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::UnavailableError("--plot: cannot create a temporary directory for gnuplot");
  }
  return std::filesystem::path(dir_template);
}

// The terminal set-up of both outputs: PNG first, `body` plots, then the same as SVG.
std::string TwoTerminals(const std::string& prefix, const std::string& body) {
  return absl::StrCat(
      "set encoding utf8\n",
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,650 "
      "noenhanced font ',10' } else { set terminal png size 1000,650 noenhanced }\n",
      "set output ", GnuplotQuote(prefix + ".png"), "\n", body,
      "set terminal svg size 1000,650 dynamic noenhanced font 'sans,10'\n", "set output ",
      GnuplotQuote(prefix + ".svg"), "\nreplot\nset output\n");
}

// Runs `script` from `dir` and checks that PREFIX.png and PREFIX.svg were written.
absl::Status RunGnuplot(const std::filesystem::path& dir, const std::string& script,
                        const std::string& prefix) {
  std::ofstream(dir / "plot.gp") << script;
  const std::string err_path = (dir / "gnuplot.err").string();
  const std::string command =
      absl::StrCat("gnuplot '", (dir / "plot.gp").string(), "' 2>'", err_path, "'");
  if (std::system(command.c_str()) != 0) {
    std::ifstream err(err_path);
    std::string line, last;
    while (std::getline(err, line)) {
      if (!line.empty()) last = line;
    }
    return absl::InternalError(
        absl::StrFormat("--plot: gnuplot failed (script kept in %s): %s", dir.string(), last));
  }
  std::error_code ec;
  for (const std::string& path : {prefix + ".png", prefix + ".svg"}) {
    if (std::filesystem::file_size(path, ec) == 0 || ec) {
      return absl::InternalError(absl::StrFormat("--plot: gnuplot wrote no '%s'", path));
    }
  }
  std::filesystem::remove_all(dir, ec);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckGnuplot() {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot)");
  }
  return absl::OkStatus();
}

// The loss axis spans orders of magnitude between near-lossless and 2-bit or tiny-budget
// configurations, so it turns logarithmic when the positive values spread over more than 100x;
// points at or below zero cannot sit on a log axis and are drawn at its floor, labelled with
// their true value.
absl::Status WriteScatterPlot(const std::string& prefix, const ScatterPlot& plot) {
  const std::vector<double>& xs = plot.x;
  double min_positive = INFINITY, max_positive = 0;
  for (double y : plot.y) {
    if (y > 0) {
      min_positive = std::min(min_positive, y);
      max_positive = std::max(max_positive, y);
    }
  }
  const bool log_y = max_positive > 0 && max_positive / min_positive > 100;
  const double floor_y = log_y ? min_positive / 4 : 0;
  auto plot_y = [&](double y) { return log_y && y <= 0 ? floor_y : y; };

  // Fixed ranges, so that label placement knows where each point lands.
  const double max_x = *std::max_element(xs.begin(), xs.end());
  const double x_hi = std::max(4.0, std::ceil(max_x * 1.15 / 4) * 4);
  double y_lo = 0, y_hi = 0;
  std::vector<double> ys;
  for (double y : plot.y) ys.push_back(plot_y(y));
  const auto [ys_min, ys_max] = std::minmax_element(ys.begin(), ys.end());
  if (log_y) {
    y_lo = std::pow(10.0, std::floor(std::log10(*ys_min)));
    y_hi = std::pow(10.0, std::ceil(std::log10(*ys_max) + 0.3));
  } else {
    const double pad = *ys_max > *ys_min ? 0.1 * (*ys_max - *ys_min) : 1.0;
    y_lo = std::min(0.0, *ys_min) - pad;
    y_hi = *ys_max + 2 * pad;
  }
  std::vector<double> gx, gy;
  std::vector<int> chars;
  for (size_t i = 0; i < xs.size(); ++i) {
    gx.push_back(xs[i] / x_hi);
    gy.push_back(log_y ? std::log10(ys[i] / y_lo) / std::log10(y_hi / y_lo)
                       : (ys[i] - y_lo) / (y_hi - y_lo));
    chars.push_back(static_cast<int>(plot.labels[i].size()));
  }
  const std::vector<LabelPlacement> placements = PlaceLabels(gx, gy, chars);
  std::string label_commands;
  for (size_t i = 0; i < xs.size(); ++i) {
    absl::StrAppendFormat(&label_commands,
                          "set label %d %s at %.6g,%.6g offset graph %.4f, graph %.4f left font "
                          "',8' front\n",
                          i + 1, GnuplotQuote(plot.labels[i]), xs[i], ys[i], placements[i].dx,
                          placements[i].dy);
  }

  KVS_ASSIGN_OR_RETURN(const std::filesystem::path dir, MakeTempDir());
  {
    std::ofstream points(dir / "points.dat");
    for (size_t i = 0; i < xs.size(); ++i) points << absl::StrFormat("%.6g %.6g\n", xs[i], ys[i]);
    std::ofstream frontier(dir / "frontier.dat");
    for (int idx : plot.frontier) {
      frontier << absl::StrFormat("%.6g %.6g\n", xs[idx], plot_y(plot.y[idx]));
    }
  }
  const std::string body = absl::StrCat(
      "set title ", GnuplotQuote(plot.title), "\nset xlabel ", GnuplotQuote(plot.xlabel), "\n",
      "set ylabel ",
      GnuplotQuote(log_y ? plot.ylabel + " (log scale; ≤ 0 drawn at the bottom)" : plot.ylabel),
      "\n", log_y ? "set logscale y\n" : "", "set grid\nset key top right\nset format y '%g'\n",
      absl::StrFormat("set xrange [0:%.6g]\nset yrange [%.6g:%.6g]\n", x_hi, y_lo, y_hi),
      label_commands, "plot ", GnuplotQuote((dir / "points.dat").string()),
      " using 1:2 with points pt 7 ps 1.3 title 'configuration', \\\n", "  ",
      GnuplotQuote((dir / "frontier.dat").string()),
      " using 1:2 with linespoints pt 6 ps 2.2 lw 2 title 'Pareto frontier'\n");
  return RunGnuplot(dir, TwoTerminals(prefix, body), prefix);
}

absl::Status WriteLinePlot(const std::string& prefix, const LinePlot& plot) {
  KVS_ASSIGN_OR_RETURN(const std::filesystem::path dir, MakeTempDir());
  std::string plots;
  for (size_t s = 0; s < plot.series.size(); ++s) {
    const std::string file = (dir / absl::StrCat("series", s, ".dat")).string();
    std::ofstream out(file);
    for (size_t i = 0; i < plot.x.size(); ++i) {
      out << absl::StrFormat("%.6g %.6g\n", plot.x[i], plot.series[s].second[i]);
    }
    absl::StrAppend(&plots, s == 0 ? "plot " : ", \\\n  ", GnuplotQuote(file),
                    " using 1:2 with linespoints pt 7 lw 2 title ",
                    GnuplotQuote(plot.series[s].first));
  }
  const std::string body = absl::StrCat(
      "set title ", GnuplotQuote(plot.title), "\nset xlabel ", GnuplotQuote(plot.xlabel),
      "\nset ylabel ", GnuplotQuote(plot.ylabel),
      "\nset grid\nset key top left\nset format y '%g'\nset logscale y\n", plots, "\n");
  return RunGnuplot(dir, TwoTerminals(prefix, body), prefix);
}

}  // namespace kvstack::cli
