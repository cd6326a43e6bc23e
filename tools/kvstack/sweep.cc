// `kvstack sweep`: the experiment that chooses a KV representation. It runs the F32-cache
// reference once, then every K x V codec pair of the grid (or the zipped pairs) over the same
// perplexity windows, and reports per configuration the storage cost (bits per element, bytes
// per token per layer, compression against F16), the accuracy loss (PPL and its change, mean
// KL divergence from the reference, top-1 agreement) and decode-attention time, as a markdown
// table, CSV, JSON and a gnuplot plot of loss against bits with the Pareto frontier.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "command.h"
#include "kvstack/codec.h"
#include "options.h"
#include "represent/lowrank_codec.h"
#include "run/evaluate.h"

namespace kvstack::cli {
namespace {

struct SweepFlags {
  std::string model;
  std::string file;
  int ctx = 512;
  std::vector<std::string> k_codecs;
  std::vector<std::string> v_codecs;
  bool pairs = false;
  int max_windows = 0;
  std::string csv_path;
  std::string json_path;
  std::string plot_prefix;
  CacheFlags cache;
  EngineFlags engine;
};

// The configurations of the sweep: the base with each codec pair substituted.
absl::StatusOr<std::vector<KvConfig>> BuildGrid(const SweepFlags& flags, const KvConfig& base) {
  std::vector<std::string> k_codecs = flags.k_codecs;
  std::vector<std::string> v_codecs = flags.v_codecs;
  if (k_codecs.empty()) k_codecs.push_back(base.k_codec);
  if (v_codecs.empty()) v_codecs.push_back(base.v_codec);
  std::vector<KvConfig> grid;
  auto add = [&](const std::string& k, const std::string& v) {
    KvConfig config = base;
    config.k_codec = k;
    config.v_codec = v;
    grid.push_back(std::move(config));
  };
  if (flags.pairs) {
    if (k_codecs.size() != v_codecs.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--pairs zips --k-codec and --v-codec, which must then have the same length; got %d "
          "key and %d value codecs",
          k_codecs.size(), v_codecs.size()));
    }
    for (size_t i = 0; i < k_codecs.size(); ++i) add(k_codecs[i], v_codecs[i]);
  } else {
    for (const std::string& k : k_codecs) {
      for (const std::string& v : v_codecs) add(k, v);
    }
  }
  return grid;
}

// Every configuration is checked against the model before any work, so a typo costs
// nothing; a bad codec name gets the codec's own message, naming the flag it came from.
absl::Status CheckGrid(const std::vector<KvConfig>& grid, const LlamaModel& model,
                       const EvaluateOptions& options) {
  const LlamaHparams& hparams = model.hparams();
  for (const KvConfig& config : grid) {
    // Low-rank codecs need the profile, which CheckConfig's cache loads; the name is checked
    // here, the rest there.
    auto check = [&](const std::string& name, CodecRole role) {
      return IsLowRankCodecName(name) ? CheckCodecName(name)
                                      : CreateCodec(name, hparams.head_dim, role).status();
    };
    for (int layer_idx = 0; layer_idx < hparams.num_layers; ++layer_idx) {
      absl::Status k = check(config.KCodecOf(layer_idx), CodecRole::kKey);
      if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("--k-codec: ", k.message()));
      absl::Status v = check(config.VCodecOf(layer_idx), CodecRole::kValue);
      if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("--v-codec: ", v.message()));
    }
    KVS_RETURN_IF_ERROR(CheckConfig(model, config, options));
  }
  return CheckConfig(model, ReferenceConfig(grid.front()), options);
}

// An output path must have an existing directory, checked before the sweep runs rather than
// discovered after it.
absl::Status CheckOutputPath(const std::string& flag, const std::string& path) {
  if (path.empty() || path == "-") return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s '%s': directory '%s' does not exist", flag, path, parent.string()));
  }
  return absl::OkStatus();
}

std::string Label(const KvConfig& config) {
  return absl::StrCat(config.k_codec, " / ", config.v_codec);
}

// The Pareto frontier of the rows on (bits per element, ΔPPL %), fewest bits first.
std::vector<int> Frontier(const std::vector<ConfigEvaluation>& rows) {
  std::vector<double> bits, loss;
  for (const ConfigEvaluation& e : rows) {
    bits.push_back(e.bits_per_element);
    loss.push_back(e.delta_ppl_pct);
  }
  return ParetoFrontier(bits, loss);
}

bool OnFrontier(const std::vector<int>& frontier, size_t row_idx) {
  return std::find(frontier.begin(), frontier.end(), static_cast<int>(row_idx)) != frontier.end();
}

std::string MarkdownTable(const std::vector<ConfigEvaluation>& rows,
                          const std::vector<int>& frontier) {
  std::string out =
      "| config (k / v) | bits/elem | bytes/token/layer | compression vs F16 | PPL | ΔPPL % | "
      "mean KL | top-1 agreement | decode attention µs/token |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ConfigEvaluation& e : rows) {
    absl::StrAppendFormat(
        &out, "| %s | %.2f | %.1f | %.2fx | %.4f | %+.3g | %.2e | %.4f | %.2f |\n", Label(e.config),
        e.bits_per_element, e.bytes_per_token_per_layer, e.compression_vs_f16, e.ppl,
        e.delta_ppl_pct, e.mean_kl, e.top1_agreement, e.decode_attention_us_per_token);
  }
  std::vector<std::string> labels;
  for (int idx : frontier) labels.push_back(Label(rows[idx].config));
  absl::StrAppend(&out,
                  "\nPareto frontier (fewest bits for a given ΔPPL): ", absl::StrJoin(labels, ", "),
                  "\n");
  return out;
}

std::string Csv(const std::vector<ConfigEvaluation>& rows, const std::vector<int>& frontier) {
  std::string out =
      "k_codec,v_codec,bits_per_element,bytes_per_token_per_layer,compression_vs_f16,ppl,"
      "ppl_stderr,delta_ppl_pct,mean_kl,top1_agreement,tokens_scored,"
      "decode_attention_us_per_token,pareto\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ConfigEvaluation& e = rows[i];
    absl::StrAppendFormat(&out, "%s,%s,%.6g,%.6g,%.6g,%.6f,%.6f,%.6g,%.6g,%.6f,%d,%.6g,%d\n",
                          e.config.k_codec, e.config.v_codec, e.bits_per_element,
                          e.bytes_per_token_per_layer, e.compression_vs_f16, e.ppl, e.ppl_stderr,
                          e.delta_ppl_pct, e.mean_kl, e.top1_agreement, e.tokens_scored,
                          e.decode_attention_us_per_token, OnFrontier(frontier, i) ? 1 : 0);
  }
  return out;
}

nlohmann::json Json(const SweepFlags& flags, const KvConfig& base, const ReferenceRun& reference,
                    const std::vector<ConfigEvaluation>& rows, const std::vector<int>& frontier) {
  nlohmann::json json_rows = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const ConfigEvaluation& e = rows[i];
    json_rows.push_back({{"k_codec", e.config.k_codec},
                         {"v_codec", e.config.v_codec},
                         {"config", KvConfigJson(e.config)},
                         {"bits_per_element", e.bits_per_element},
                         {"bytes_per_token_per_layer", e.bytes_per_token_per_layer},
                         {"compression_vs_f16", e.compression_vs_f16},
                         {"ppl", e.ppl},
                         {"ppl_stderr", e.ppl_stderr},
                         {"delta_ppl_pct", e.delta_ppl_pct},
                         {"mean_kl", e.mean_kl},
                         {"top1_agreement", e.top1_agreement},
                         {"tokens_scored", e.tokens_scored},
                         {"decode_attention_us_per_token", e.decode_attention_us_per_token},
                         {"pareto", OnFrontier(frontier, i)}});
  }
  return nlohmann::json{{"model", flags.model},
                        {"file", flags.file},
                        {"ctx", flags.ctx},
                        {"windows", reference.num_windows},
                        {"base_config", KvConfigJson(base)},
                        {"reference",
                         {{"config", KvConfigJson(reference.config)},
                          {"ppl", reference.perplexity.ppl},
                          {"ppl_stderr", reference.perplexity.ppl_stderr},
                          {"tokens_scored", reference.perplexity.tokens_scored}}},
                        {"rows", std::move(json_rows)}};
}

absl::Status WriteOutput(const std::string& flag, const std::string& path,
                         const std::string& text) {
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return absl::OkStatus();
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrFormat("%s: cannot write '%s'", flag, path));
  return absl::OkStatus();
}

// A gnuplot single-quoted string: only the quote itself needs escaping (by doubling).
std::string GnuplotQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

absl::Status CheckGnuplot() {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot)");
  }
  return absl::OkStatus();
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

// Writes PREFIX.png and PREFIX.svg: ΔPPL % against bits per element, one labelled point per
// configuration and the Pareto frontier as a line. ΔPPL spans orders of magnitude between F16
// (~0.01 %) and 2-bit codecs (tens of %), so the axis turns logarithmic when the positive
// values spread over more than 100x; points at or below zero cannot sit on a log axis and are
// drawn at its floor, labelled with their true value.
absl::Status WritePlot(const std::string& prefix, const std::vector<ConfigEvaluation>& rows,
                       int ctx) {
  std::vector<double> bits, loss;
  double min_positive = INFINITY, max_positive = 0;
  for (const ConfigEvaluation& e : rows) {
    bits.push_back(e.bits_per_element);
    loss.push_back(e.delta_ppl_pct);
    if (e.delta_ppl_pct > 0) {
      min_positive = std::min(min_positive, e.delta_ppl_pct);
      max_positive = std::max(max_positive, e.delta_ppl_pct);
    }
  }
  const bool log_y = max_positive > 0 && max_positive / min_positive > 100;
  const double floor_y = log_y ? min_positive / 4 : 0;
  auto plot_y = [&](double y) { return log_y && y <= 0 ? floor_y : y; };

  // Fixed ranges, so that label placement knows where each point lands.
  const double max_bits = *std::max_element(bits.begin(), bits.end());
  const double x_hi = std::max(4.0, std::ceil(max_bits * 1.15 / 4) * 4);
  double y_lo = 0, y_hi = 0;
  std::vector<double> ys;
  for (double y : loss) ys.push_back(plot_y(y));
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
  std::vector<std::string> labels;
  for (size_t i = 0; i < rows.size(); ++i) {
    gx.push_back(bits[i] / x_hi);
    gy.push_back(log_y ? std::log10(ys[i] / y_lo) / std::log10(y_hi / y_lo)
                       : (ys[i] - y_lo) / (y_hi - y_lo));
    labels.push_back(absl::StrFormat("%s (%+.3g%%)", Label(rows[i].config), loss[i]));
    chars.push_back(static_cast<int>(labels.back().size()));
  }
  const std::vector<LabelPlacement> placements = PlaceLabels(gx, gy, chars);
  std::string label_commands;
  for (size_t i = 0; i < rows.size(); ++i) {
    absl::StrAppendFormat(&label_commands,
                          "set label %d %s at %.6g,%.6g offset graph %.4f, graph %.4f left font "
                          "',8' front\n",
                          i + 1, GnuplotQuote(labels[i]), bits[i], ys[i], placements[i].dx,
                          placements[i].dy);
  }

  std::error_code ec;
  std::string dir_template = (std::filesystem::temp_directory_path(ec) / "kvstack-sweep-XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::UnavailableError("--plot: cannot create a temporary directory for gnuplot");
  }
  const std::filesystem::path dir = dir_template;
  {
    std::ofstream points(dir / "points.dat");
    for (size_t i = 0; i < rows.size(); ++i) {
      points << absl::StrFormat("%.6g %.6g\n", bits[i], ys[i]);
    }
    std::ofstream frontier(dir / "frontier.dat");
    for (int idx : Frontier(rows)) {
      frontier << absl::StrFormat("%.6g %.6g\n", bits[idx], plot_y(loss[idx]));
    }
  }
  const std::string png = prefix + ".png";
  const std::string svg = prefix + ".svg";
  std::string script = absl::StrCat(
      "set encoding utf8\n",
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,650 "
      "noenhanced font ',10' } else { set terminal png size 1000,650 noenhanced }\n",
      "set output ", GnuplotQuote(png), "\n",
      absl::StrFormat("set title 'KV representation: accuracy loss vs storage (ctx %d)'\n", ctx),
      "set xlabel 'bits per element (K and V averaged)'\n",
      log_y ? "set ylabel 'ΔPPL % vs F32 cache (log scale; ≤ 0 drawn at the bottom)'\n"
              "set logscale y\n"
            : "set ylabel 'ΔPPL % vs F32 cache'\n",
      "set grid\nset key top right\nset format y '%g'\n",
      absl::StrFormat("set xrange [0:%.6g]\nset yrange [%.6g:%.6g]\n", x_hi, y_lo, y_hi),
      label_commands, "plot ", GnuplotQuote((dir / "points.dat").string()),
      " using 1:2 with points pt 7 ps 1.3 title 'configuration', \\\n", "  ",
      GnuplotQuote((dir / "frontier.dat").string()),
      " using 1:2 with linespoints pt 6 ps 2.2 lw 2 title 'Pareto frontier'\n",
      "set terminal svg size 1000,650 dynamic noenhanced font 'sans,10'\n", "set output ",
      GnuplotQuote(svg), "\nreplot\nset output\n");
  std::ofstream(dir / "plot.gp") << script;
  const std::string err_path = (dir / "gnuplot.err").string();
  const std::string command =
      absl::StrCat("gnuplot '", (dir / "plot.gp").string(), "' 2>'", err_path, "'");
  const int status = std::system(command.c_str());
  if (status != 0) {
    std::ifstream err(err_path);
    std::string line, last;
    while (std::getline(err, line)) {
      if (!line.empty()) last = line;
    }
    return absl::InternalError(
        absl::StrFormat("--plot: gnuplot failed (script kept in %s): %s", dir.string(), last));
  }
  for (const std::string& path : {png, svg}) {
    if (std::filesystem::file_size(path, ec) == 0 || ec) {
      return absl::InternalError(absl::StrFormat("--plot: gnuplot wrote no '%s'", path));
    }
  }
  std::filesystem::remove_all(dir, ec);
  return absl::OkStatus();
}

absl::Status RunSweep(const SweepFlags& flags) {
  KVS_ASSIGN_OR_RETURN(KvConfig base, flags.cache.Resolve());
  KVS_ASSIGN_OR_RETURN(std::vector<KvConfig> grid, BuildGrid(flags, base));
  if (flags.csv_path == "-" && flags.json_path == "-") {
    return absl::InvalidArgumentError("only one of --csv and --json can be '-' (stdout)");
  }
  if (flags.max_windows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max-windows must be >= 0 (0 = all), got %d", flags.max_windows));
  }
  KVS_RETURN_IF_ERROR(CheckOutputPath("--csv", flags.csv_path));
  KVS_RETURN_IF_ERROR(CheckOutputPath("--json", flags.json_path));
  KVS_RETURN_IF_ERROR(CheckOutputPath("--plot", flags.plot_prefix));
  if (!flags.plot_prefix.empty()) KVS_RETURN_IF_ERROR(CheckGnuplot());
  KVS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(flags.file, "text file"));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(flags.model));
  EvaluateOptions options;
  options.ctx = flags.ctx;
  options.num_threads = flags.engine.threads;
  options.batch = std::min(flags.engine.batch, flags.ctx);
  options.max_windows = flags.max_windows;
  KVS_RETURN_IF_ERROR(CheckGrid(grid, *model, options));

  const std::vector<TokenId> tokens = model->tokenizer().Encode(text, /*add_bos=*/true);
  int num_windows = flags.ctx > 0 ? static_cast<int>(tokens.size() / flags.ctx) : 0;
  if (flags.max_windows > 0) num_windows = std::min(num_windows, flags.max_windows);

  ReferenceRun reference;
  std::vector<ConfigEvaluation> rows;
  {
    ProgressBar bar("sweep");
    const int total = num_windows * static_cast<int>(grid.size() + 1);
    KVS_ASSIGN_OR_RETURN(reference, RunReference(*model, tokens, base, options,
                                                 [&](int done, int) { bar.Update(done, total); }));
    for (size_t i = 0; i < grid.size(); ++i) {
      const int done_before = num_windows * static_cast<int>(i + 1);
      KVS_ASSIGN_OR_RETURN(
          ConfigEvaluation eval,
          EvaluateConfig(*model, tokens, grid[i], options, reference,
                         [&](int done, int) { bar.Update(done_before + done, total); }));
      rows.push_back(std::move(eval));
    }
  }

  const std::vector<int> frontier = Frontier(rows);
  if (flags.csv_path != "-" && flags.json_path != "-") {
    std::printf(
        "Reference (k=v=f32): PPL = %.4f +/- %.4f, %lld tokens scored in %d windows of "
        "%d\nBase config: %s\n\n%s",
        reference.perplexity.ppl, reference.perplexity.ppl_stderr,
        static_cast<long long>(reference.perplexity.tokens_scored), reference.num_windows,
        flags.ctx, base.ToString().c_str(), MarkdownTable(rows, frontier).c_str());
  }
  if (!flags.csv_path.empty())
    KVS_RETURN_IF_ERROR(WriteOutput("--csv", flags.csv_path, Csv(rows, frontier)));
  if (!flags.json_path.empty()) {
    KVS_RETURN_IF_ERROR(WriteOutput("--json", flags.json_path,
                                    Json(flags, base, reference, rows, frontier).dump(2) + "\n"));
  }
  if (!flags.plot_prefix.empty()) {
    KVS_RETURN_IF_ERROR(WritePlot(flags.plot_prefix, rows, flags.ctx));
  }
  return absl::OkStatus();
}

}  // namespace

RunFn RegisterSweep(CLI::App& app) {
  auto flags = std::make_shared<SweepFlags>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "Choose a KV representation: perplexity, KL and top-1 agreement against the F32 cache, "
      "size and decode-attention time for every K x V codec pair");
  sub->add_option("--model,-m", flags->model, "GGUF model file")->required();
  sub->add_option("--file,-f", flags->file, "text file")->required();
  sub->add_option("--ctx,-c", flags->ctx, "perplexity window in tokens (default 512)");
  sub->add_option("--k-codec", flags->k_codecs,
                  "key codecs, comma-separated (default: the base config's)")
      ->delimiter(',');
  sub->add_option("--v-codec", flags->v_codecs,
                  "value codecs, comma-separated (default: the base config's)")
      ->delimiter(',');
  sub->add_flag("--pairs", flags->pairs,
                "zip --k-codec and --v-codec into pairs instead of every K x V");
  sub->add_option("--max-windows", flags->max_windows,
                  "perplexity windows per configuration, 0 = the whole text (default 0)");
  sub->add_option("--csv", flags->csv_path, "write the rows as CSV to FILE ('-' = stdout)");
  sub->add_option("--json", flags->json_path, "write the rows as JSON to FILE ('-' = stdout)");
  sub->add_option("--plot", flags->plot_prefix,
                  "write PREFIX.png and PREFIX.svg: ΔPPL vs bits with the Pareto frontier "
                  "(needs gnuplot)");
  flags->cache.Add(sub, /*with_codec_flags=*/false);
  flags->engine.Add(sub);
  return [flags]() { return RunSweep(*flags); };
}

}  // namespace kvstack::cli
