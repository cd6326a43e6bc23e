// `kvstack sweep --max-dppl P --max-bits B --max-bits-at-ctx H [--prefer memory|peak-memory|
// speed|accuracy] [--write-config FILE]`: the step from measuring cache designs to running one.
// Among the sweep's rows within the bounds given (perplexity within P % of the F32 full
// cache's, at most B bits per element of context stored, at most H held at ctx), it picks the
// one that stores the fewest bits per element of context (or held the fewest bytes at its
// fullest, or attends fastest, or loses least perplexity), and writes it as a TOML file that
// `--kv-config` runs as it was measured. So both questions a user asks have one command: the
// smallest cache within an accuracy loss, and the most accurate one within a memory budget.
#pragma once

#include <cstddef>
#include <optional>
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
  kAccuracy,    // ΔPPL, then memory_bits, then attention time
};

// "memory" | "peak-memory" | "speed" | "accuracy"; errors name them all.
absl::StatusOr<ChoiceObjective> ParseChoiceObjective(std::string_view name);
std::string_view ChoiceObjectiveName(ChoiceObjective objective);
// What the objective minimises, in words ("fewest bits per element of context", ...).
std::string_view ChoiceObjectiveWanted(ChoiceObjective objective);

// What a chosen row must meet; a choice needs at least one. A bound holds where the row's
// figure is at most it (a NaN figure never does).
struct ChoiceBounds {
  std::optional<double> max_dppl_pct;     // --max-dppl: delta_ppl_pct
  std::optional<double> max_bits;         // --max-bits: memory_bits
  std::optional<double> max_bits_at_ctx;  // --max-bits-at-ctx: bits_at_ctx

  bool any() const { return max_dppl_pct || max_bits || max_bits_at_ctx; }
  // The flags as given ("--max-dppl 1 --max-bits 4.5"), and in the choice line's words
  // ("ΔPPL <= 1 % and bits/elem of context <= 4.5").
  std::string Flags() const;
  std::string Words() const;
};

// Whether a figure of bits per element is within a bound. Figures are sums of per-head and
// per-layer shares (2.5 + 10 x 0.1 comes to 3.5000000000000004), so the bound admits what
// exceeds it by rounding only: 1e-9 of it.
bool WithinBitBound(double bits, double max_bits);

// What a choice minimises when --prefer is not given: the fewest bits within an accuracy
// bound, the smallest loss within memory bounds alone.
ChoiceObjective DefaultObjective(const ChoiceBounds& bounds);

// The index into `rows` of the best row within every bound, the first of equals.
// Error (one line): no row qualifies; it names the bounds and, for each kind of bound, the
// row that came closest to it among those meeting the other kind (among all where none does).
absl::StatusOr<size_t> ChooseRow(std::span<const ConfigEvaluation> rows, const ChoiceBounds& bounds,
                                 ChoiceObjective objective);

// How the chosen row was measured, for the file's header: the run to repeat for its PPL.
struct ChoiceContext {
  std::string model;
  std::string text_file;
  int ctx = 0;
  int batch = 0;  // tokens per forward call the rows ran with
  int windows = 0;
  double reference_ppl = 0;
  ChoiceBounds bounds;
  ChoiceObjective objective = ChoiceObjective::kMemory;
};

// The chosen configuration as a --kv-config file: comment lines saying what was measured and
// how to repeat it, then KvConfigToml(config). `config` is the grid's configuration (capacity
// as the user gave it), `row` its measurement.
std::string ChosenConfigFile(const KvConfig& config, const ConfigEvaluation& row,
                             const ChoiceContext& context);

}  // namespace kvstack::cli
