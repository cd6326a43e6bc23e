// `kvstack sweep --max-dppl P [--prefer memory|peak-memory|speed] [--write-config FILE]`: the
// step from measuring cache designs to running one. Among the sweep's rows whose perplexity is
// within P % of the F32 full cache's, it picks the one that stores the fewest bits per element
// of context (or held the fewest bytes at its fullest, or attends fastest), and writes it as a
// TOML file that `--kv-config` runs as it was measured.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "kvstack/kv_config.h"
#include "kvstack/status.h"
#include "run/evaluate.h"

namespace kvstack::cli {

// What a choice minimises among the rows within the accuracy bound.
enum class ChoiceObjective {
  kMemory,      // memory_bits (bits per element of context), then ΔPPL, then attention time
  kPeakMemory,  // bits_at_ctx (the cache's peak bytes in use, F32 rows included), then ΔPPL,
                // then attention time
  kSpeed,       // decode attention time per token, then memory_bits, then ΔPPL
};

// "memory" | "peak-memory" | "speed"; errors name them all.
absl::StatusOr<ChoiceObjective> ParseChoiceObjective(std::string_view name);
std::string_view ChoiceObjectiveName(ChoiceObjective objective);
// What the objective minimises, in words ("fewest bits per element of context", ...).
std::string_view ChoiceObjectiveWanted(ChoiceObjective objective);

// The index into `rows` of the best row with delta_ppl_pct <= max_dppl_pct, the first of equals.
// Error (one line): no row qualifies; it names the bound and the row that came closest.
absl::StatusOr<size_t> ChooseRow(std::span<const ConfigEvaluation> rows, double max_dppl_pct,
                                 ChoiceObjective objective);

// How the chosen row was measured, for the file's header: the run to repeat for its PPL.
struct ChoiceContext {
  std::string model;
  std::string text_file;
  int ctx = 0;
  int batch = 0;  // tokens per forward call the rows ran with
  int windows = 0;
  double reference_ppl = 0;
  double max_dppl_pct = 0;
  ChoiceObjective objective = ChoiceObjective::kMemory;
};

// The chosen configuration as a --kv-config file: comment lines saying what was measured and
// how to repeat it, then KvConfigToml(config). `config` is the grid's configuration (capacity
// as the user gave it), `row` its measurement.
std::string ChosenConfigFile(const KvConfig& config, const ConfigEvaluation& row,
                             const ChoiceContext& context);

}  // namespace kvstack::cli
