// The sweep's choice of one configuration, and the file that runs it (sweep_choice.h).
#include "sweep_choice.h"

#include <optional>
#include <tuple>
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
};

const ObjectiveWords& WordsOf(ChoiceObjective objective) {
  for (const ObjectiveWords& words : kObjectiveWords) {
    if (words.objective == objective) return words;
  }
  KVS_CHECK(false);
  return kObjectiveWords[0];
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

absl::StatusOr<size_t> ChooseRow(std::span<const ConfigEvaluation> rows, double max_dppl_pct,
                                 ChoiceObjective objective) {
  std::optional<size_t> best;
  std::optional<size_t> closest;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!closest || rows[i].delta_ppl_pct < rows[*closest].delta_ppl_pct) closest = i;
    if (!(rows[i].delta_ppl_pct <= max_dppl_pct)) continue;  // a NaN ΔPPL never qualifies
    if (!best || Key(rows[i], objective) < Key(rows[*best], objective)) best = i;
  }
  if (best) return *best;
  if (!closest) return absl::InvalidArgumentError("--max-dppl: the sweep has no rows");
  return absl::NotFoundError(absl::StrFormat(
      "--max-dppl %g: no configuration is within %g %% of the F32 cache's perplexity (the "
      "closest, %s, is %+.3g %%); nothing chosen",
      max_dppl_pct, max_dppl_pct, SweepLabel(rows[*closest].config), rows[*closest].delta_ppl_pct));
}

std::string ChosenConfigFile(const KvConfig& config, const ConfigEvaluation& row,
                             const ChoiceContext& context) {
  std::string out = absl::StrFormat(
      "# KV cache design chosen by `kvstack sweep --max-dppl %g --prefer %s`: of the rows within\n"
      "# %g %% of the F32 full cache's perplexity, the one with the %s.\n"
      "#   %s: %.2f bits/element (%.2f of context), %.1f bytes/token/layer;\n"
      "#   the cache held at most %zu bytes for %d tokens (%.2f bits/element, F32 rows included)\n"
      "#   PPL %.4f against F32 %.4f (ΔPPL %+.3g %%), mean KL %.2e, top-1 agreement %.4f\n"
      "#   decode attention %.2f µs/token\n"
      "# Measured on %s\n"
      "#   with %s: %d windows of %d tokens, in forward calls of %d.\n"
      "# Run with it:  kvstack generate --model M --kv-config THIS_FILE ...\n"
      "# Measure again: kvstack perplexity --model M --file F --ctx %d --batch %d "
      "--kv-config THIS_FILE\n",
      context.max_dppl_pct, ChoiceObjectiveName(context.objective), context.max_dppl_pct,
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
