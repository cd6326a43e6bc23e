// `kvstack sweep`: the experiment that chooses a KV cache design. It runs the F32 full-cache
// reference once, then every configuration of the grid — K x V codec pairs (or zipped pairs)
// times selection policies times budgets — over the same perplexity windows, and reports per
// configuration the storage cost (bits per element, bytes per token per layer, compression
// against F16, the share of the context kept), the accuracy loss (PPL and its change, mean KL
// divergence from the reference, top-1 agreement), decode-attention time and, with
// --retrieval-probe, whether the cache still finds a passage seen long before. Output: a
// markdown table, CSV, JSON and a gnuplot plot of loss against memory with the Pareto frontier.
// With --stream N it instead streams N tokens through each configuration and reports
// perplexity per segment (sweep_stream.cc).
#include "sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kvstack/codec.h"
#include "represent/lowrank_codec.h"
#include "run/sequence_logits.h"
#include "sweep_choice.h"
#include "sweep_plot.h"

namespace kvstack::cli {
namespace {

// One row of the sweep: the evaluation, and the retrieval probe when asked for.
struct SweepRow {
  ConfigEvaluation eval;
  std::optional<RetrievalProbeResult> probe;
};

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

// The Pareto frontier of the rows on (bits, ΔPPL %), fewest bits first, with `bits_of` the
// figure that counts.
std::vector<int> Frontier(const std::vector<SweepRow>& rows, double ConfigEvaluation::*bits_of) {
  std::vector<double> bits, loss;
  for (const SweepRow& row : rows) {
    bits.push_back(row.eval.*bits_of);
    loss.push_back(row.eval.delta_ppl_pct);
  }
  return ParetoFrontier(bits, loss);
}

// The rows' two frontiers: by the bits per element of context the encoded tokens take
// (memory_bits, what long contexts approach), and by what the cache held at this ctx
// (bits_at_ctx, F32 rows included).
struct Frontiers {
  explicit Frontiers(const std::vector<SweepRow>& rows)
      : of_context(Frontier(rows, &ConfigEvaluation::memory_bits)),
        at_ctx(Frontier(rows, &ConfigEvaluation::bits_at_ctx)) {}
  std::vector<int> of_context;
  std::vector<int> at_ctx;
};

bool OnFrontier(const std::vector<int>& frontier, size_t row_idx) {
  return std::find(frontier.begin(), frontier.end(), static_cast<int>(row_idx)) != frontier.end();
}

// How much of the full cache's advantage on the passage's second copy a configuration keeps:
// 1 when it predicts the copy as well as the full cache, 0 when as badly as a first reading.
double Recall(const RetrievalProbeResult& probe, const RetrievalProbeResult& full) {
  const double gain = full.first_copy_nll - full.second_copy_nll;
  return gain > 0 ? (full.first_copy_nll - probe.second_copy_nll) / gain : 0.0;
}

std::string MarkdownTable(const std::vector<SweepRow>& rows, const Frontiers& frontiers,
                          const std::optional<RetrievalProbeResult>& full_probe) {
  std::string out =
      "| config | bits/elem | bytes/token/layer | compression vs F16 | kept | bits at ctx | PPL | "
      "ΔPPL % | mean KL | top-1 agreement | decode attention µs/token |";
  std::string rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";
  if (full_probe) {
    absl::StrAppend(&out, " 2nd-copy NLL | recall |");
    absl::StrAppend(&rule, "---:|---:|");
  }
  absl::StrAppend(&out, "\n", rule, "\n");
  for (const SweepRow& row : rows) {
    const ConfigEvaluation& e = row.eval;
    absl::StrAppendFormat(&out,
                          "| %s | %.2f | %.1f | %.2fx | %.3f | %.2f | %.4f | %+.3g | %.2e | %.4f | "
                          "%.2f |",
                          SweepLabel(e.config), e.bits_per_element, e.bytes_per_token_per_layer,
                          e.compression_vs_f16, e.kept_fraction, e.bits_at_ctx, e.ppl,
                          e.delta_ppl_pct, e.mean_kl, e.top1_agreement,
                          e.decode_attention_us_per_token);
    if (full_probe) {
      absl::StrAppendFormat(&out, " %.3f | %.2f |", row.probe->second_copy_nll,
                            Recall(*row.probe, *full_probe));
    }
    absl::StrAppend(&out, "\n");
  }
  const auto labels = [&](const std::vector<int>& indices) {
    std::vector<std::string> names;
    for (int idx : indices) names.push_back(SweepLabel(rows[idx].eval.config));
    return absl::StrJoin(names, ", ");
  };
  absl::StrAppend(&out, "\nPareto frontier (fewest bits of context for a given ΔPPL): ",
                  labels(frontiers.of_context), "\n");
  absl::StrAppend(
      &out, "At this ctx (fewest bits held, F32 rows included): ", labels(frontiers.at_ctx), "\n");
  if (full_probe) {
    absl::StrAppendFormat(&out,
                          "Retrieval probe, full F32 cache: 2nd-copy NLL %.3f, 1st-copy NLL %.3f "
                          "(recall 1 = as the full cache, 0 = the first copy is lost)\n",
                          full_probe->second_copy_nll, full_probe->first_copy_nll);
  }
  return out;
}

std::string Csv(const std::vector<SweepRow>& rows, const std::vector<int>& frontier,
                const std::optional<RetrievalProbeResult>& full_probe) {
  std::string out =
      "k_codec,v_codec,policy,budget,recent_tokens,bits_per_element,bytes_per_token_per_layer,"
      "compression_vs_f16,kept_fraction,memory_bits,peak_cache_bytes,bits_at_ctx,ppl,ppl_stderr,"
      "delta_ppl_pct,mean_kl,top1_agreement,tokens_scored,decode_attention_us_per_token,pareto";
  if (full_probe) absl::StrAppend(&out, ",second_copy_nll,recall");
  absl::StrAppend(&out, "\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const ConfigEvaluation& e = rows[i].eval;
    absl::StrAppendFormat(
        &out,
        "%s,%s,%s,%s,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%zu,%.6g,%.6f,%.6f,%.6g,%.6g,%.6f,%d,%.6g,%d",
        e.config.k_codec, e.config.v_codec, e.config.policy, e.config.budget.ToString(),
        e.config.recent_tokens, e.bits_per_element, e.bytes_per_token_per_layer,
        e.compression_vs_f16, e.kept_fraction, e.memory_bits, e.peak_cache_bytes, e.bits_at_ctx,
        e.ppl, e.ppl_stderr, e.delta_ppl_pct, e.mean_kl, e.top1_agreement, e.tokens_scored,
        e.decode_attention_us_per_token, OnFrontier(frontier, i) ? 1 : 0);
    if (full_probe) {
      absl::StrAppendFormat(&out, ",%.6g,%.6g", rows[i].probe->second_copy_nll,
                            Recall(*rows[i].probe, *full_probe));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

nlohmann::json ProbeJson(const RetrievalProbeResult& probe) {
  return {{"second_copy_nll", probe.second_copy_nll},
          {"first_copy_nll", probe.first_copy_nll},
          {"tokens_scored", probe.tokens_scored}};
}

// What --max-dppl, --max-bits and --max-bits-at-ctx chose: made once the rows are measured and
// before any output, so that the JSON carries it; a bound nothing meets is reported (and fails
// the command) after every output.
struct SweepChoice {
  ChoiceObjective objective = ChoiceObjective::kMemory;
  absl::StatusOr<size_t> row;
};

nlohmann::json ChoiceJson(const ChoiceBounds& bounds, const SweepChoice& choice) {
  const auto bound = [](const std::optional<double>& b) {
    return b ? nlohmann::json(*b) : nlohmann::json(nullptr);
  };
  nlohmann::json json{{"max_dppl_pct", bound(bounds.max_dppl_pct)},
                      {"max_bits", bound(bounds.max_bits)},
                      {"max_bits_at_ctx", bound(bounds.max_bits_at_ctx)},
                      {"prefer", ChoiceObjectiveName(choice.objective)},
                      {"row", nullptr}};
  if (choice.row.ok()) {
    json["row"] = *choice.row;
  } else {
    json["error"] = std::string(choice.row.status().message());
  }
  return json;
}

nlohmann::json Json(const SweepFlags& flags, const KvConfig& base, const ReferenceRun& reference,
                    const std::vector<SweepRow>& rows, const Frontiers& frontiers,
                    const std::optional<RetrievalProbeResult>& full_probe,
                    const std::optional<SweepChoice>& choice) {
  nlohmann::json json_rows = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const ConfigEvaluation& e = rows[i].eval;
    nlohmann::json row = {{"k_codec", e.config.k_codec},
                          {"v_codec", e.config.v_codec},
                          {"policy", e.config.policy},
                          {"budget", e.config.budget.ToString()},
                          {"recent_tokens", e.config.recent_tokens},
                          {"config", KvConfigJson(e.config)},
                          {"bits_per_element", e.bits_per_element},
                          {"bytes_per_token_per_layer", e.bytes_per_token_per_layer},
                          {"compression_vs_f16", e.compression_vs_f16},
                          {"kept_fraction", e.kept_fraction},
                          {"memory_bits", e.memory_bits},
                          {"peak_cache_bytes", e.peak_cache_bytes},
                          {"bits_at_ctx", e.bits_at_ctx},
                          {"ppl", e.ppl},
                          {"ppl_stderr", e.ppl_stderr},
                          {"delta_ppl_pct", e.delta_ppl_pct},
                          {"mean_kl", e.mean_kl},
                          {"top1_agreement", e.top1_agreement},
                          {"tokens_scored", e.tokens_scored},
                          {"decode_attention_us_per_token", e.decode_attention_us_per_token},
                          {"pareto", OnFrontier(frontiers.of_context, i)},
                          {"pareto_at_ctx", OnFrontier(frontiers.at_ctx, i)}};
    if (full_probe) {
      row["retrieval_probe"] = ProbeJson(*rows[i].probe);
      row["retrieval_probe"]["recall"] = Recall(*rows[i].probe, *full_probe);
    }
    json_rows.push_back(std::move(row));
  }
  nlohmann::json json{{"model", flags.model},
                      {"file", flags.file},
                      {"ctx", flags.ctx},
                      {"windows", reference.num_windows},
                      {"base_config", KvConfigJson(base)},
                      {"reference",
                       {{"config", KvConfigJson(reference.config)},
                        {"ppl", reference.perplexity.ppl},
                        {"ppl_stderr", reference.perplexity.ppl_stderr},
                        {"tokens_scored", reference.perplexity.tokens_scored},
                        {"peak_cache_bytes", reference.perplexity.peak_cache_bytes}}},
                      {"rows", std::move(json_rows)}};
  if (full_probe) json["reference"]["retrieval_probe"] = ProbeJson(*full_probe);
  if (choice) json["choice"] = ChoiceJson(flags.choice_bounds, *choice);
  return json;
}

// The plot of ΔPPL against memory: the bits the encoded tokens take (and their frontier), or
// with `held` the bits the cache held at ctx (and the frontier at this ctx).
absl::Status WritePlot(const std::string& prefix, const std::vector<SweepRow>& rows,
                       const Frontiers& frontiers, int ctx, bool held) {
  ScatterPlot plot;
  const bool evicts = std::any_of(rows.begin(), rows.end(),
                                  [](const SweepRow& row) { return row.eval.config.evicts(); });
  plot.title = absl::StrFormat("KV cache design: accuracy loss vs memory (ctx %d)", ctx);
  if (held) {
    plot.xlabel = absl::StrFormat("bits per element held at ctx %d (F32 rows included)", ctx);
  } else {
    plot.xlabel = evicts ? "bits per element of context (bits per stored element x share kept)"
                         : "bits per element (K and V averaged)";
  }
  plot.ylabel = "ΔPPL % vs F32 full cache";
  for (const SweepRow& row : rows) {
    plot.x.push_back(held ? row.eval.bits_at_ctx : row.eval.memory_bits);
    plot.y.push_back(row.eval.delta_ppl_pct);
    plot.labels.push_back(
        absl::StrFormat("%s (%+.3g%%)", SweepLabel(row.eval.config), row.eval.delta_ppl_pct));
  }
  plot.frontier = held ? frontiers.at_ctx : frontiers.of_context;
  return WriteScatterPlot(prefix, plot);
}

// The objective --prefer names, or the bounds' default.
absl::StatusOr<ChoiceObjective> ObjectiveOf(const SweepFlags& flags) {
  if (flags.prefer.empty()) return DefaultObjective(flags.choice_bounds);
  return ParseChoiceObjective(flags.prefer);
}

// The choice among the measured rows (CheckChoiceFlags has checked --prefer).
SweepChoice Choose(const SweepFlags& flags, const std::vector<SweepRow>& rows) {
  SweepChoice choice;
  choice.objective = *ObjectiveOf(flags);
  std::vector<ConfigEvaluation> evals;
  for (const SweepRow& row : rows) evals.push_back(row.eval);
  choice.row = ChooseRow(evals, flags.choice_bounds, choice.objective);
  return choice;
}

// --max-dppl, --max-bits, --max-bits-at-ctx: names the chosen row (on stderr when stdout
// carries CSV or JSON) and, with --write-config, writes it. Runs after every other output, so
// bounds nothing meets lose none of them.
absl::Status ChooseAndWrite(const SweepFlags& flags, const std::vector<KvConfig>& grid,
                            const std::vector<SweepRow>& rows, const SweepChoice& choice,
                            const ReferenceRun& reference, const EvaluateOptions& options) {
  const ChoiceObjective objective = choice.objective;
  KVS_ASSIGN_OR_RETURN(const size_t chosen, choice.row);
  const ConfigEvaluation& row = rows[chosen].eval;
  std::string line = absl::StrFormat(
      "Chosen within %s (%s): %s, %.2f bits/elem (%.2f of context, %.2f in use at ctx %d), "
      "ΔPPL %+.3g %%, decode attention %.2f µs/token",
      flags.choice_bounds.Words(), ChoiceObjectiveWanted(objective), SweepLabel(row.config),
      row.bits_per_element, row.memory_bits, row.bits_at_ctx, flags.ctx, row.delta_ppl_pct,
      row.decode_attention_us_per_token);
  if (!flags.write_config_path.empty()) {
    const ChoiceContext context{.model = flags.model,
                                .text_file = flags.file,
                                .ctx = flags.ctx,
                                .batch = options.batch > 0 ? options.batch : flags.ctx,
                                .windows = reference.num_windows,
                                .reference_ppl = reference.perplexity.ppl,
                                .bounds = flags.choice_bounds,
                                .objective = objective};
    KVS_RETURN_IF_ERROR(WriteOutput("--write-config", flags.write_config_path,
                                    ChosenConfigFile(grid[chosen], row, context)));
    absl::StrAppend(&line, "; written to ", flags.write_config_path);
  }
  std::fprintf(flags.csv_path == "-" || flags.json_path == "-" ? stderr : stdout, "%s\n",
               line.c_str());
  return absl::OkStatus();
}

// The --probe-heads rows at the grid's end, and what --mix-best builds from their results.
struct HeadProbePlan {
  std::pair<std::string, std::string> codecs;
  size_t num_rows = 0;  // the grid's last num_rows configurations, layer-major
  int num_kv_heads = 0;
};

// --mix-fit's count: the memory bounds given, each as the first row's and the probe rows'
// figures (the probes are the rows' last probe.num_rows).
std::optional<int> FitMix(const ChoiceBounds& bounds, const std::vector<SweepRow>& rows,
                          const HeadProbePlan& probe, std::span<const double> probe_dppl) {
  std::vector<std::vector<double>> figures;
  std::vector<MixBudget> budgets;
  const auto add = [&](const std::optional<double>& max_bits, double ConfigEvaluation::*figure) {
    if (!max_bits) return;
    std::vector<double>& probe_bits = figures.emplace_back();
    for (size_t i = rows.size() - probe.num_rows; i < rows.size(); ++i) {
      probe_bits.push_back(rows[i].eval.*figure);
    }
    budgets.push_back(
        {.first_bits = rows.front().eval.*figure, .probe_bits = {}, .max_bits = *max_bits});
  };
  add(bounds.max_bits, &ConfigEvaluation::memory_bits);
  add(bounds.max_bits_at_ctx, &ConfigEvaluation::bits_at_ctx);
  for (size_t i = 0; i < budgets.size(); ++i) budgets[i].probe_bits = figures[i];
  return FittingMixCount(probe_dppl, budgets);
}

// The line that says what --mix-fit took; `also_mix_best`: --mix-best already asked for that
// count, whose row it is.
std::string MixFitNote(const ChoiceBounds& bounds, const HeadProbePlan& probe,
                       std::optional<int> fitted, bool also_mix_best) {
  const std::string codecs = absl::StrCat(probe.codecs.first, " / ", probe.codecs.second);
  ChoiceBounds memory = bounds;
  memory.max_dppl_pct.reset();
  if (!fitted) {
    return absl::StrCat("--mix-fit: no number of heads in ", codecs, " fits ", memory.Words(),
                        "; no mix row added");
  }
  if (*fitted == 0) {
    return absl::StrCat("--mix-fit: ", memory.Words(), " takes none of the heads in ", codecs,
                        " beyond the first row; no mix row added");
  }
  return absl::StrFormat("--mix-fit: the %d best-probed of %d heads in %s fit %s; their mix is %s",
                         *fitted, probe.num_rows, codecs, memory.Words(),
                         also_mix_best ? "--mix-best's row of that count" : "the last row");
}

// --mix-greedy N's evaluations after `num_probes` probe rows (0 for N = 0).
int GreedyEvaluations(size_t num_probes, int num_heads) {
  int evaluations = 0;
  for (int round = 2; round <= num_heads; ++round) {
    evaluations += static_cast<int>(num_probes) - round + 1;
  }
  return evaluations;
}

// What --mix-greedy chose: round 1's head (the best probe's, a probe index) and rounds 2..N,
// with where their rows are (round 1's is the best probe row; rounds 2..N follow rows_begin).
struct GreedyOrder {
  size_t probe_begin = 0;  // the first probe row
  size_t rows_begin = 0;   // round 2's row
  int first_head = 0;
  std::vector<GreedyRound> rounds;

  size_t num_heads() const { return rounds.size() + 1; }
  // The head round r added and the row of its mix (r from 0).
  int HeadOf(size_t r) const { return r == 0 ? first_head : rounds[r - 1].head; }
  size_t RowOf(size_t r) const {
    return r == 0 ? probe_begin + static_cast<size_t>(first_head) : rows_begin + r - 1;
  }
};

std::string HeadName(int head, int num_kv_heads) {
  return absl::StrCat(head / num_kv_heads, ".", head % num_kv_heads);
}

// The line that says what --mix-greedy chose: each head with its mix's ΔPPL.
std::string GreedyNote(const GreedyOrder& greedy, const std::vector<SweepRow>& rows,
                       const HeadProbePlan& probe) {
  std::vector<std::string> steps;
  for (size_t r = 0; r < greedy.num_heads(); ++r) {
    const size_t row = greedy.RowOf(r);
    steps.push_back(absl::StrFormat("%s %+.3g %%", HeadName(greedy.HeadOf(r), probe.num_kv_heads),
                                    rows[row].eval.delta_ppl_pct));
  }
  return absl::StrFormat(
      "--mix-greedy: heads in %s / %s in the order chosen, each with its mix's ΔPPL: %s; rounds "
      "2..%d are the last %d rows (%d evaluations)",
      probe.codecs.first, probe.codecs.second, absl::StrJoin(steps, ", "), greedy.num_heads(),
      greedy.rounds.size(), GreedyEvaluations(probe.num_rows, greedy.num_heads()));
}

// --json's "mix_greedy": per round, the head added, the row of its mix and every candidate's
// ΔPPL (round 1's candidates are the probe rows).
nlohmann::json GreedyJson(const GreedyOrder& greedy, const std::vector<SweepRow>& rows,
                          const HeadProbePlan& probe) {
  nlohmann::json json = nlohmann::json::array();
  for (size_t r = 0; r < greedy.num_heads(); ++r) {
    const size_t row = greedy.RowOf(r);
    nlohmann::json candidates = nlohmann::json::array();
    for (size_t head = 0; head < probe.num_rows; ++head) {
      const double dppl = r == 0 ? rows[greedy.probe_begin + head].eval.delta_ppl_pct
                                 : greedy.rounds[r - 1].candidate_dppl[head];
      if (std::isnan(dppl)) continue;
      candidates.push_back({{"layer", head / probe.num_kv_heads},
                            {"kv_head", head % probe.num_kv_heads},
                            {"delta_ppl_pct", dppl}});
    }
    json.push_back({{"layer", greedy.HeadOf(r) / probe.num_kv_heads},
                    {"kv_head", greedy.HeadOf(r) % probe.num_kv_heads},
                    {"row", row},
                    {"delta_ppl_pct", rows[row].eval.delta_ppl_pct},
                    {"candidates", std::move(candidates)}});
  }
  return json;
}

// --mix-greedy N after the probe rows (rows [probe_begin, +probe.num_rows), their ΔPPL
// probe_dppl): GreedyMixRounds, each round's mix appended to `grid` and `rows` (with its
// retrieval probe where `probe_options` is given). `progress` hears the windows evaluated.
absl::StatusOr<GreedyOrder> RunGreedyMix(int num_heads, const HeadProbePlan& probe,
                                         size_t probe_begin, std::span<const double> probe_dppl,
                                         const LlamaModel& model, std::span<const TokenId> tokens,
                                         const EvaluateOptions& options,
                                         const ReferenceRun& reference,
                                         const RetrievalProbeOptions* probe_options,
                                         const std::function<void(int)>& progress,
                                         std::vector<KvConfig>* grid, std::vector<SweepRow>* rows) {
  int windows_before = 0;
  const EvaluateMixFn evaluate = [&](const KvConfig& config) -> absl::StatusOr<ConfigEvaluation> {
    int windows = 0;
    absl::StatusOr<ConfigEvaluation> mix =
        EvaluateConfig(model, tokens, config, options, reference, [&](int done, int) {
          windows = done;
          progress(windows_before + done);
        });
    windows_before += windows;
    return mix;
  };
  GreedyOrder greedy;
  KVS_ASSIGN_OR_RETURN(greedy.rounds, GreedyMixRounds(grid->front(), probe.codecs, probe_dppl,
                                                      probe.num_kv_heads, num_heads, evaluate));
  greedy.probe_begin = probe_begin;
  greedy.rows_begin = rows->size();
  greedy.first_head = RankProbes(probe_dppl).front();
  for (const GreedyRound& round : greedy.rounds) {
    grid->push_back(round.config);
    SweepRow row;
    row.eval = round.mix;
    if (probe_options != nullptr) {
      KVS_ASSIGN_OR_RETURN(row.probe, RetrievalProbe(model, tokens, grid->back(), *probe_options));
    }
    rows->push_back(std::move(row));
  }
  return greedy;
}

absl::Status RunGridSweep(const SweepFlags& flags, const KvConfig& base, std::vector<KvConfig> grid,
                          const std::optional<HeadProbePlan>& probe, const LlamaModel& model,
                          std::span<const TokenId> tokens, const EvaluateOptions& options) {
  int num_windows = flags.ctx > 0 ? static_cast<int>(tokens.size() / flags.ctx) : 0;
  if (flags.max_windows > 0) num_windows = std::min(num_windows, flags.max_windows);
  RetrievalProbeOptions probe_options;
  probe_options.num_threads = options.num_threads;
  probe_options.batch = options.batch;

  ReferenceRun reference;
  std::vector<SweepRow> rows;
  std::optional<RetrievalProbeResult> full_probe;
  std::string mix_note;  // what --mix-fit took, said once the progress bar is gone
  std::optional<GreedyOrder> greedy;
  {
    ProgressBar bar("sweep");
    const int total =
        num_windows * static_cast<int>(grid.size() + 1 +
                                       (probe ? flags.mix_best.size() + flags.mix_fit +
                                                    GreedyEvaluations(probe->num_rows,
                                                                      flags.mix_greedy.value_or(0))
                                              : 0));
    KVS_ASSIGN_OR_RETURN(reference, RunReference(model, tokens, base, options,
                                                 [&](int done, int) { bar.Update(done, total); }));
    if (flags.retrieval_probe) {
      KVS_ASSIGN_OR_RETURN(full_probe,
                           RetrievalProbe(model, tokens, reference.config, probe_options));
    }
    auto evaluate_rows = [&](size_t begin) -> absl::Status {
      for (size_t i = begin; i < grid.size(); ++i) {
        const int done_before = num_windows * static_cast<int>(i + 1);
        SweepRow row;
        KVS_ASSIGN_OR_RETURN(row.eval, EvaluateConfig(model, tokens, grid[i], options, reference,
                                                      [&](int done, int) {
                                                        bar.Update(done_before + done, total);
                                                      }));
        if (flags.retrieval_probe) {
          KVS_ASSIGN_OR_RETURN(row.probe, RetrievalProbe(model, tokens, grid[i], probe_options));
        }
        rows.push_back(std::move(row));
      }
      return absl::OkStatus();
    };
    KVS_RETURN_IF_ERROR(evaluate_rows(0));
    // The mixes need the probes' results, so they are built and run after them.
    const size_t probe_begin = probe ? rows.size() - probe->num_rows : rows.size();
    std::vector<double> probe_dppl;
    for (size_t i = probe_begin; i < rows.size(); ++i) {
      probe_dppl.push_back(rows[i].eval.delta_ppl_pct);
    }
    if (probe && (!flags.mix_best.empty() || flags.mix_fit)) {
      std::vector<int> counts = flags.mix_best;
      if (flags.mix_fit) {
        const std::optional<int> fitted = FitMix(flags.choice_bounds, rows, *probe, probe_dppl);
        const bool also_mix_best = fitted && absl::c_linear_search(counts, *fitted);
        mix_note = MixFitNote(flags.choice_bounds, *probe, fitted, also_mix_best);
        if (fitted && *fitted > 0 && !also_mix_best) counts.push_back(*fitted);
      }
      const size_t num_before = grid.size();
      const std::vector<KvConfig> mixes =
          HeadMixRows(grid.front(), probe->codecs, probe_dppl, probe->num_kv_heads, counts);
      grid.insert(grid.end(), mixes.begin(), mixes.end());
      KVS_RETURN_IF_ERROR(evaluate_rows(num_before));
    }
    if (probe && flags.mix_greedy) {
      const int done_before = num_windows * static_cast<int>(rows.size() + 1);
      KVS_ASSIGN_OR_RETURN(
          greedy, RunGreedyMix(
                      *flags.mix_greedy, *probe, probe_begin, probe_dppl, model, tokens, options,
                      reference, flags.retrieval_probe ? &probe_options : nullptr,
                      [&](int done) { bar.Update(done_before + done, total); }, &grid, &rows));
    }
  }

  if (!mix_note.empty()) std::fprintf(stderr, "%s\n", mix_note.c_str());
  if (greedy) std::fprintf(stderr, "%s\n", GreedyNote(*greedy, rows, *probe).c_str());
  const Frontiers frontiers(rows);
  std::optional<SweepChoice> choice;
  if (flags.choice_bounds.any()) choice = Choose(flags, rows);
  if (flags.csv_path != "-" && flags.json_path != "-") {
    std::printf(
        "Reference (k=v=f32, full cache): PPL = %.4f +/- %.4f, %lld tokens scored in %d windows "
        "of %d\nBase config: %s\n\n%s",
        reference.perplexity.ppl, reference.perplexity.ppl_stderr,
        static_cast<long long>(reference.perplexity.tokens_scored), reference.num_windows,
        flags.ctx, base.ToString().c_str(), MarkdownTable(rows, frontiers, full_probe).c_str());
  }
  if (!flags.csv_path.empty()) {
    KVS_RETURN_IF_ERROR(
        WriteOutput("--csv", flags.csv_path, Csv(rows, frontiers.of_context, full_probe)));
  }
  if (!flags.json_path.empty()) {
    nlohmann::json json = Json(flags, base, reference, rows, frontiers, full_probe, choice);
    if (greedy) json["mix_greedy"] = GreedyJson(*greedy, rows, *probe);
    KVS_RETURN_IF_ERROR(WriteOutput("--json", flags.json_path, json.dump(2) + "\n"));
  }
  if (!flags.plot_prefix.empty()) {
    KVS_RETURN_IF_ERROR(WritePlot(flags.plot_prefix, rows, frontiers, flags.ctx, flags.plot_held));
  }
  if (!choice) return absl::OkStatus();
  return ChooseAndWrite(flags, grid, rows, *choice, reference, options);
}

// A bound of the choice: a finite number, >= 0 for a percent, > 0 for bits.
absl::Status CheckBound(const char* flag, const std::optional<double>& bound, bool percent) {
  // NaN fails every comparison, so it is refused too.
  if (!bound || (std::isfinite(*bound) && (percent ? *bound >= 0 : *bound > 0))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      percent
          ? absl::StrFormat("%s must be a percent >= 0 (e.g. 2 for 2 %%), got %g", flag, *bound)
          : absl::StrFormat("%s must be bits per element > 0 (e.g. 4.5), got %g", flag, *bound));
}

// --max-dppl, --max-bits, --max-bits-at-ctx, --prefer, --write-config and --mix-best, checked
// before any work.
absl::Status CheckChoiceFlags(const SweepFlags& flags) {
  const ChoiceBounds& bounds = flags.choice_bounds;
  KVS_RETURN_IF_ERROR(CheckBound("--max-dppl", bounds.max_dppl_pct, /*percent=*/true));
  KVS_RETURN_IF_ERROR(CheckBound("--max-bits", bounds.max_bits, /*percent=*/false));
  KVS_RETURN_IF_ERROR(CheckBound("--max-bits-at-ctx", bounds.max_bits_at_ctx, /*percent=*/false));
  if (!bounds.any() && (!flags.prefer.empty() || !flags.write_config_path.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        flags.prefer.empty() ? "--write-config" : "--prefer",
        " needs a bound to choose within: --max-dppl, --max-bits or --max-bits-at-ctx"));
  }
  if (bounds.any()) {
    if (flags.stream_tokens > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          bounds.Flags(),
          ": the choice weighs ΔPPL over perplexity windows; --stream reports segments instead"));
    }
    KVS_RETURN_IF_ERROR(ObjectiveOf(flags).status());
  }
  if (flags.mix_fit && !bounds.max_bits && !bounds.max_bits_at_ctx) {
    return absl::InvalidArgumentError(
        "--mix-fit fills a memory budget: give --max-bits or --max-bits-at-ctx");
  }
  if ((!flags.mix_best.empty() || flags.mix_greedy) && flags.stream_tokens > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flags.mix_best.empty() ? "--mix-greedy" : "--mix-best",
                     " ranks heads by ΔPPL over perplexity windows; --stream reports segments"));
  }
  if (flags.write_config_path == "-") {
    return absl::InvalidArgumentError("--write-config needs a file path ('-' is not one)");
  }
  return CheckOutputPath("--write-config", flags.write_config_path);
}

absl::Status RunSweep(const SweepFlags& flags) {
  KVS_ASSIGN_OR_RETURN(KvConfig base, flags.cache.Resolve());
  KVS_ASSIGN_OR_RETURN(std::vector<KvConfig> grid, BuildGrid(flags, base));
  std::optional<std::pair<std::string, std::string>> probe_codecs;
  if (!flags.probe_heads.empty()) {
    KVS_ASSIGN_OR_RETURN(probe_codecs, ParseProbeHeads(flags.probe_heads));
  }
  if (flags.csv_path == "-" && flags.json_path == "-") {
    return absl::InvalidArgumentError("only one of --csv and --json can be '-' (stdout)");
  }
  if (flags.max_windows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max-windows must be >= 0 (0 = all), got %d", flags.max_windows));
  }
  if (flags.stream_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--stream must be >= 0 (0 = off), got %d", flags.stream_tokens));
  }
  if (flags.plot_held && flags.stream_tokens > 0) {
    return absl::InvalidArgumentError(
        "--plot-held plots the rows' memory; --stream plots perplexity per segment instead");
  }
  KVS_RETURN_IF_ERROR(CheckChoiceFlags(flags));
  KVS_RETURN_IF_ERROR(CheckOutputPath("--csv", flags.csv_path));
  KVS_RETURN_IF_ERROR(CheckOutputPath("--json", flags.json_path));
  KVS_RETURN_IF_ERROR(CheckOutputPath("--plot", flags.plot_prefix));
  if (!flags.plot_prefix.empty()) KVS_RETURN_IF_ERROR(CheckGnuplot());
  KVS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(flags.file, "text file"));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(flags.model));
  std::optional<HeadProbePlan> probe;
  if (probe_codecs) {
    const int num_kv_heads = model->hparams().num_kv_heads;
    const std::vector<KvConfig> probes =
        HeadProbeRows(grid.front(), *probe_codecs, model->hparams().num_layers, num_kv_heads);
    grid.insert(grid.end(), probes.begin(), probes.end());
    probe = HeadProbePlan{
        .codecs = *probe_codecs, .num_rows = probes.size(), .num_kv_heads = num_kv_heads};
    for (const int count : flags.mix_best) {
      if (count < 1 || static_cast<size_t>(count) > probes.size()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--mix-best %d: allowed 1..%d, the model's kv heads (%d layers x %d)",
                            count, probes.size(), model->hparams().num_layers, num_kv_heads));
      }
    }
    if (flags.mix_greedy &&
        (*flags.mix_greedy < 2 || static_cast<size_t>(*flags.mix_greedy) > probes.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mix-greedy %d: allowed 2..%d, the model's kv heads (%d layers x %d; one head is "
          "the best probe row itself)",
          *flags.mix_greedy, probes.size(), model->hparams().num_layers, num_kv_heads));
    }
  }
  EvaluateOptions options;
  options.ctx = flags.stream_tokens > 0 ? flags.stream_tokens : flags.ctx;
  options.num_threads = flags.engine.threads;
  options.batch = flags.engine.batch_given() ? std::min(flags.engine.batch, options.ctx) : 0;
  // Every row of one sweep runs in the same forward calls: when any configuration evicts, the
  // others run in the evicting default's short calls too. Codecs whose error depends on the
  // calls (a recent F32 window sees more of a long call quantised) then compare alike.
  if (options.batch == 0 &&
      std::any_of(grid.begin(), grid.end(), [](const KvConfig& c) { return c.evicts(); })) {
    options.batch = std::min(kEvictingBatch, options.ctx);
  }
  options.max_windows = flags.max_windows;
  const std::vector<TokenId> tokens = model->tokenizer().Encode(text, /*add_bos=*/true);
  // Before CheckGrid builds engines of options.ctx tokens (a --ctx or --stream longer than the
  // text would allocate caches that size first).
  if (tokens.size() < static_cast<size_t>(options.ctx)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sweep: the text has %d tokens, fewer than %s %d", tokens.size(),
                        flags.stream_tokens > 0 ? "--stream" : "one window of --ctx", options.ctx));
  }
  KVS_RETURN_IF_ERROR(CheckGrid(grid, *model, options));

  if (flags.stream_tokens > 0) {
    return RunStreamSweep(flags, base, grid, *model, tokens, options);
  }
  return RunGridSweep(flags, base, std::move(grid), probe, *model, tokens, options);
}

}  // namespace

RunFn RegisterSweep(CLI::App& app) {
  auto flags = std::make_shared<SweepFlags>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "Choose a KV cache design: perplexity, KL and top-1 agreement against the F32 full "
      "cache, size, share of the context kept and decode-attention time for every K x V codec "
      "pair, selection policy and budget");
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
  sub->add_option("--lowrank", flags->lowrank,
                  "low-rank or latent codecs added as K = V rows, comma-separated (needs "
                  "--profile): r<rank>[-int4] and e<percent>[-int4] for lowrank-..., or full "
                  "names such as latent-r8")
      ->delimiter(',');
  CLI::Option* probe_heads =
      sub->add_option("--probe-heads", flags->probe_heads,
                      "K:V (or one codec for both): after the grid, one row per layer and kv head "
                      "of the model, the first configuration with that head alone stored as K/V; "
                      "their ΔPPL ranks the heads for --head-codec");
  sub->add_option("--mix-best", flags->mix_best,
                  "N,...: after the --probe-heads rows, one row per N: the first configuration "
                  "with the N heads whose probes lost least stored as the probe's codecs")
      ->delimiter(',')
      ->needs(probe_heads);
  sub->add_flag("--mix-fit", flags->mix_fit,
                "after the --probe-heads rows, one more mix: as many of the best-probed heads in "
                "the probe's codecs as --max-bits / --max-bits-at-ctx take (the fewest that "
                "fit where the probe's codecs are the smaller)")
      ->needs(probe_heads);
  sub->add_option("--mix-greedy", flags->mix_greedy,
                  "N: after the --probe-heads rows, mixes of 2..N heads chosen one at a time: "
                  "each round re-probes every head not yet chosen with the chosen ones in the "
                  "probe's codecs and keeps the best (one row per round; N - 1 rounds of one "
                  "evaluation per head not yet chosen)")
      ->needs(probe_heads);
  sub->add_option("--policy", flags->policies,
                  "selection policies, comma-separated: full, window, streaming, h2o, tova, "
                  "snapkv, duo (default: the base config's)")
      ->delimiter(',');
  sub->add_option("--budget", flags->budgets,
                  "budgets of the evicting policies, comma-separated: tokens per kv head "
                  "(256), share of the context (50%) or bytes per sequence (64KiB)")
      ->delimiter(',');
  sub->add_option("--recent", flags->recents,
                  "tokens kept in F32 before they are encoded (KIVI's residual), comma-separated: "
                  "one row per value, e.g. 0,32,64 (default: the base config's, 0)")
      ->delimiter(',');
  sub->add_flag("--retrieval-probe", flags->retrieval_probe,
                "also score a passage repeated after unrelated text (does the cache still hold "
                "the first copy?)");
  CLI::Option* stream =
      sub->add_option("--stream", flags->stream_tokens,
                      "instead of perplexity windows, stream this many tokens through each "
                      "configuration and report perplexity per segment (0 = off)");
  sub->add_option("--segment", flags->segment_tokens,
                  "--stream: tokens per reported segment (default 512)")
      ->needs(stream);
  sub->add_option("--max-windows", flags->max_windows,
                  "perplexity windows per configuration, 0 = the whole text (default 0)");
  sub->add_option("--csv", flags->csv_path, "write the rows as CSV to FILE ('-' = stdout)");
  sub->add_option("--json", flags->json_path, "write the rows as JSON to FILE ('-' = stdout)");
  CLI::Option* plot = sub->add_option(
      "--plot", flags->plot_prefix,
      "write PREFIX.png and PREFIX.svg: ΔPPL vs memory with the Pareto frontier, or "
      "PPL per segment with --stream (needs gnuplot)");
  sub->add_flag("--plot-held", flags->plot_held,
                "plot the bits per element the cache held at --ctx (F32 recent and pending rows "
                "included) and the frontier at this ctx, instead of the bits stored")
      ->needs(plot);
  sub->add_option("--max-dppl", flags->choice_bounds.max_dppl_pct,
                  "after the sweep, choose the best row whose ΔPPL % is at most this (e.g. 2), "
                  "as --prefer says; an error naming the closest row when none is");
  sub->add_option("--max-bits", flags->choice_bounds.max_bits,
                  "choose among rows storing at most this many bits per element of context "
                  "(e.g. 4.5): with --max-dppl, both bounds hold; alone, the most accurate row "
                  "within it");
  sub->add_option("--max-bits-at-ctx", flags->choice_bounds.max_bits_at_ctx,
                  "choose among rows whose cache held at most this many bits per element at "
                  "--ctx, F32 recent and pending rows included (the 'bits at ctx' column)");
  sub->add_option("--prefer", flags->prefer,
                  "what the choice minimises: memory (bits per element of context, the figure "
                  "long contexts approach; the default with --max-dppl), peak-memory (bytes the "
                  "cache held at its fullest at this --ctx, F32 recent and pending rows "
                  "included), speed (decode attention time) or accuracy (ΔPPL; the default "
                  "without --max-dppl)");
  sub->add_option("--write-config", flags->write_config_path,
                  "write the chosen configuration as a TOML file for --kv-config");
  flags->cache.Add(sub, /*with_grid_flags=*/false);
  flags->engine.Add(sub);
  return [flags]() { return RunSweep(*flags); };
}

}  // namespace kvstack::cli
