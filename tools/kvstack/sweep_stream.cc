// `kvstack sweep --stream N`: one stream of N tokens through every configuration, perplexity
// per segment — StreamingLLM's experiment: past the trained length, which caches stay flat?
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sweep.h"
#include "sweep_plot.h"

namespace kvstack::cli {
namespace {

struct StreamRow {
  std::string label;
  StreamingResult result;
};

std::string MarkdownTable(const std::vector<StreamRow>& rows, int segment) {
  const size_t num_segments = rows.front().result.segment_ppl.size();
  std::string out = "| config |";
  std::string rule = "|---|";
  for (size_t s = 0; s < num_segments; ++s) {
    absl::StrAppendFormat(&out, " %d-%d |", s * segment, (s + 1) * segment);
    absl::StrAppend(&rule, "---:|");
  }
  absl::StrAppend(&out, " last / first | KiB held at most |\n", rule, "---:|---:|\n");
  for (const StreamRow& row : rows) {
    const std::vector<double>& ppl = row.result.segment_ppl;
    absl::StrAppend(&out, "| ", row.label, " |");
    for (double p : ppl) absl::StrAppendFormat(&out, " %.3f |", p);
    absl::StrAppendFormat(&out, " %.3f | %.1f |\n", ppl.back() / ppl.front(),
                          row.result.peak_cache_bytes / 1024.0);
  }
  return out;
}

std::string Csv(const std::vector<StreamRow>& rows, int segment) {
  std::string out = "config,segment_begin,segment_end,ppl\n";
  for (const StreamRow& row : rows) {
    for (size_t s = 0; s < row.result.segment_ppl.size(); ++s) {
      absl::StrAppendFormat(&out, "%s,%d,%d,%.6f\n", row.label, s * segment, (s + 1) * segment,
                            row.result.segment_ppl[s]);
    }
  }
  return out;
}

nlohmann::json Json(const SweepFlags& flags, const std::vector<StreamRow>& rows) {
  nlohmann::json json_rows = nlohmann::json::array();
  for (const StreamRow& row : rows) {
    json_rows.push_back({{"label", row.label},
                         {"config", KvConfigJson(row.result.config)},
                         {"segment_ppl", row.result.segment_ppl},
                         {"ppl", row.result.ppl},
                         {"peak_cache_bytes", row.result.peak_cache_bytes}});
  }
  return {{"model", flags.model},
          {"file", flags.file},
          {"stream_tokens", flags.stream_tokens},
          {"segment_tokens", flags.segment_tokens},
          {"rows", std::move(json_rows)}};
}

}  // namespace

absl::Status RunStreamSweep(const SweepFlags& flags, const KvConfig& base,
                            const std::vector<KvConfig>& grid, const LlamaModel& model,
                            std::span<const TokenId> tokens, const EvaluateOptions& options) {
  StreamingOptions stream;
  stream.total_tokens = flags.stream_tokens;
  stream.segment_tokens = flags.segment_tokens;
  stream.batch = options.batch;
  stream.num_threads = options.num_threads;
  std::vector<KvConfig> configs = {ReferenceConfig(base)};
  configs.insert(configs.end(), grid.begin(), grid.end());
  std::vector<StreamRow> rows;
  {
    ProgressBar bar("stream");
    for (size_t i = 0; i < configs.size(); ++i) {
      bar.Update(static_cast<int>(i), static_cast<int>(configs.size()));
      KVS_ASSIGN_OR_RETURN(StreamingResult result,
                           StreamingPerplexity(model, tokens, configs[i], stream));
      std::string label = SweepLabel(configs[i]);
      if (i == 0) label = absl::StrCat(label, " (full cache)");
      if (configs[i].evicts() && configs[i].positions == "reassign") {
        absl::StrAppend(&label, " reassign");
      }
      rows.push_back({std::move(label), std::move(result)});
    }
    bar.Update(static_cast<int>(configs.size()), static_cast<int>(configs.size()));
  }
  if (flags.csv_path != "-" && flags.json_path != "-") {
    std::printf(
        "Streaming %d tokens (the model file's context_length: %d), perplexity per segment of "
        "%d\n\n%s",
        flags.stream_tokens, model.hparams().context_length, flags.segment_tokens,
        MarkdownTable(rows, flags.segment_tokens).c_str());
  }
  if (!flags.csv_path.empty()) {
    KVS_RETURN_IF_ERROR(WriteOutput("--csv", flags.csv_path, Csv(rows, flags.segment_tokens)));
  }
  if (!flags.json_path.empty()) {
    KVS_RETURN_IF_ERROR(WriteOutput("--json", flags.json_path, Json(flags, rows).dump(2) + "\n"));
  }
  if (!flags.plot_prefix.empty()) {
    LinePlot plot;
    plot.title = absl::StrFormat("Streaming %d tokens: perplexity per %d-token segment",
                                 flags.stream_tokens, flags.segment_tokens);
    plot.xlabel = "tokens streamed (segment end)";
    plot.ylabel = "perplexity (log scale)";
    for (size_t s = 0; s < rows.front().result.segment_ppl.size(); ++s) {
      plot.x.push_back(static_cast<double>((s + 1) * flags.segment_tokens));
    }
    for (const StreamRow& row : rows) plot.series.emplace_back(row.label, row.result.segment_ppl);
    KVS_RETURN_IF_ERROR(WriteLinePlot(flags.plot_prefix, plot));
  }
  return absl::OkStatus();
}

}  // namespace kvstack::cli
