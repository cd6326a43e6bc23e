// The sweep's choice of one configuration, and the file that runs it (sweep_choice.h).
#include "sweep_choice.h"

#include <functional>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "sweep.h"

namespace kvstack::cli {
namespace {

// What the objective compares, most significant first.
std::tuple<double, double, double> Key(const ConfigEvaluation& row, ChoiceObjective objective) {
  switch (objective) {
    case ChoiceObjective::kSpeed:
      return {row.decode_attention_us_per_token, row.memory_bits, row.delta_ppl_pct};
    case ChoiceObjective::kPeakMemory:
      return {row.bits_at_ctx, row.delta_ppl_pct, row.decode_attention_us_per_token};
    case ChoiceObjective::kAccuracy:
      return {row.delta_ppl_pct, row.memory_bits, row.decode_attention_us_per_token};
    case ChoiceObjective::kMemory:
      break;
  }
  return {row.memory_bits, row.delta_ppl_pct, row.decode_attention_us_per_token};
}

// Each objective's --prefer name and what it minimises, in the choice line's words.
struct ObjectiveWords {
  ChoiceObjective objective;
  std::string_view name;
  std::string_view wanted;
};
constexpr ObjectiveWords kObjectiveWords[] = {
    {ChoiceObjective::kMemory, "memory", "fewest bits per element of context"},
    {ChoiceObjective::kPeakMemory, "peak-memory", "fewest bytes in use at the run's fullest"},
    {ChoiceObjective::kSpeed, "speed", "fastest decode attention"},
    {ChoiceObjective::kAccuracy, "accuracy", "smallest ΔPPL"},
};

const ObjectiveWords& WordsOf(ChoiceObjective objective) {
  for (const ObjectiveWords& words : kObjectiveWords) {
    if (words.objective == objective) return words;
  }
  KVS_CHECK(false);
  return kObjectiveWords[0];
}

bool WithinAccuracy(const ConfigEvaluation& row, const ChoiceBounds& bounds) {
  return !bounds.max_dppl_pct || row.delta_ppl_pct <= *bounds.max_dppl_pct;
}

bool WithinMemory(const ConfigEvaluation& row, const ChoiceBounds& bounds) {
  return (!bounds.max_bits || WithinBitBound(row.memory_bits, *bounds.max_bits)) &&
         (!bounds.max_bits_at_ctx || WithinBitBound(row.bits_at_ctx, *bounds.max_bits_at_ctx));
}

// The row least in `figure` among those `eligible` admits, and whether any was admitted (where
// none is, the least of all rows). Rows is not empty.
std::pair<size_t, bool> LeastAmong(std::span<const ConfigEvaluation> rows,
                                   const std::function<bool(const ConfigEvaluation&)>& eligible,
                                   double ConfigEvaluation::*figure) {
  bool any = false;
  for (const ConfigEvaluation& row : rows) any = any || eligible(row);
  std::optional<size_t> least;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (any && !eligible(rows[i])) continue;
    if (!least || rows[i].*figure < rows[*least].*figure) least = i;
  }
  return {*least, any};
}

// Why nothing was chosen: for each kind of bound, the row that came closest to it among those
// meeting the other kind.
std::string NearestMisses(std::span<const ConfigEvaluation> rows, const ChoiceBounds& bounds) {
  const bool memory_bounded = bounds.max_bits || bounds.max_bits_at_ctx;
  std::vector<std::string> misses;
  if (bounds.max_dppl_pct) {
    const auto [i, within] = LeastAmong(
        rows, [&](const auto& row) { return WithinMemory(row, bounds); },
        &ConfigEvaluation::delta_ppl_pct);
    misses.push_back(absl::StrFormat(
        "the %s: %s at %+.3g %%",
        memory_bounded && within ? "most accurate within the memory bounds" : "closest",
        SweepLabel(rows[i].config), rows[i].delta_ppl_pct));
  }
  const auto fewest = [&](double ConfigEvaluation::*figure, std::string_view what) {
    const auto [i, within] = LeastAmong(
        rows, [&](const auto& row) { return WithinAccuracy(row, bounds); }, figure);
    misses.push_back(absl::StrFormat("the fewest %s%s: %s at %.2f", what,
                                     bounds.max_dppl_pct && within ? " within the ΔPPL bound" : "",
                                     SweepLabel(rows[i].config), rows[i].*figure));
  };
  if (bounds.max_bits) fewest(&ConfigEvaluation::memory_bits, "bits of context");
  if (bounds.max_bits_at_ctx) fewest(&ConfigEvaluation::bits_at_ctx, "bits held at ctx");
  return absl::StrJoin(misses, "; ");
}

// A comment line's text on one line whatever the paths hold.
std::string OneLine(const std::string& text) {
  return absl::StrReplaceAll(text, {{"\n", " "}, {"\r", " "}});
}

}  // namespace

absl::StatusOr<ChoiceObjective> ParseChoiceObjective(std::string_view name) {
  std::vector<std::string> names;
  for (const ObjectiveWords& words : kObjectiveWords) {
    if (words.name == name) return words.objective;
    names.emplace_back(words.name);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--prefer '", std::string(name), "' is unknown; allowed: ", absl::StrJoin(names, ", ")));
}

std::string_view ChoiceObjectiveName(ChoiceObjective objective) { return WordsOf(objective).name; }

std::string_view ChoiceObjectiveWanted(ChoiceObjective objective) {
  return WordsOf(objective).wanted;
}

std::string ChoiceBounds::Flags() const {
  std::vector<std::string> flags;
  if (max_dppl_pct) flags.push_back(absl::StrFormat("--max-dppl %g", *max_dppl_pct));
  if (max_bits) flags.push_back(absl::StrFormat("--max-bits %g", *max_bits));
  if (max_bits_at_ctx) flags.push_back(absl::StrFormat("--max-bits-at-ctx %g", *max_bits_at_ctx));
  return absl::StrJoin(flags, " ");
}

std::string ChoiceBounds::Words() const {
  std::vector<std::string> words;
  if (max_dppl_pct) words.push_back(absl::StrFormat("ΔPPL <= %g %%", *max_dppl_pct));
  if (max_bits) words.push_back(absl::StrFormat("bits/elem of context <= %g", *max_bits));
  if (max_bits_at_ctx) {
    words.push_back(absl::StrFormat("bits/elem held at ctx <= %g", *max_bits_at_ctx));
  }
  return absl::StrJoin(words, " and ");
}

bool WithinBitBound(double bits, double max_bits) { return bits <= max_bits * (1 + 1e-9); }

ChoiceObjective DefaultObjective(const ChoiceBounds& bounds) {
  return bounds.max_dppl_pct ? ChoiceObjective::kMemory : ChoiceObjective::kAccuracy;
}

absl::StatusOr<size_t> ChooseRow(std::span<const ConfigEvaluation> rows, const ChoiceBounds& bounds,
                                 ChoiceObjective objective) {
  if (rows.empty()) return absl::InvalidArgumentError("the sweep has no rows to choose from");
  std::optional<size_t> best;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!WithinAccuracy(rows[i], bounds) || !WithinMemory(rows[i], bounds)) continue;
    if (!best || Key(rows[i], objective) < Key(rows[*best], objective)) best = i;
  }
  if (best) return *best;
  return absl::NotFoundError(
      absl::StrFormat("%s: no configuration is within %s (%s); nothing chosen", bounds.Flags(),
                      bounds.Words(), NearestMisses(rows, bounds)));
}

std::string ChosenConfigFile(const KvConfig& config, const ConfigEvaluation& row,
                             const ChoiceContext& context) {
  std::string out = absl::StrFormat(
      "# KV cache design chosen by `kvstack sweep %s --prefer %s`: of the rows within\n"
      "# %s, the one with the %s.\n"
      "#   %s: %.2f bits/element (%.2f of context), %.1f bytes/token/layer;\n"
      "#   the cache held at most %zu bytes for %d tokens (%.2f bits/element, F32 rows included)\n"
      "#   PPL %.4f against F32 %.4f (ΔPPL %+.3g %%), mean KL %.2e, top-1 agreement %.4f\n"
      "#   decode attention %.2f µs/token\n"
      "# Measured on %s\n"
      "#   with %s: %d windows of %d tokens, in forward calls of %d.\n"
      "# Run with it:  kvstack generate --model M --kv-config THIS_FILE ...\n"
      "# Measure again: kvstack perplexity --model M --file F --ctx %d --batch %d "
      "--kv-config THIS_FILE\n",
      context.bounds.Flags(), ChoiceObjectiveName(context.objective), context.bounds.Words(),
      ChoiceObjectiveWanted(context.objective), SweepLabel(config), row.bits_per_element,
      row.memory_bits, row.bytes_per_token_per_layer, row.peak_cache_bytes, context.ctx,
      row.bits_at_ctx, row.ppl, context.reference_ppl, row.delta_ppl_pct, row.mean_kl,
      row.top1_agreement, row.decode_attention_us_per_token, OneLine(context.model),
      OneLine(context.text_file), context.windows, context.ctx, context.batch, context.ctx,
      context.batch);
  absl::StrAppend(&out, KvConfigToml(config));
  return out;
}

}  // namespace kvstack::cli
