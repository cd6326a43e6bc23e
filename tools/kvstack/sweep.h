// `kvstack sweep`'s parts: the flags, the grid of configurations they describe, and the two
// modes that run it — perplexity windows (sweep.cc) and one long stream (sweep_stream.cc).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "command.h"
#include "kvstack/kv_config.h"
#include "kvstack/model.h"
#include "options.h"
#include "run/evaluate.h"
#include "run/long_context_eval.h"
#include "sweep_choice.h"

namespace kvstack::cli {

struct SweepFlags {
  std::string model;
  std::string file;
  int ctx = 512;
  std::vector<std::string> k_codecs;
  std::vector<std::string> v_codecs;
  bool pairs = false;
  std::vector<std::string> lowrank;  // --lowrank: K = V rows of profiled codecs
  std::string probe_heads;           // --probe-heads: "K:V" or "C" for each (layer, kv head)
  std::vector<int> mix_best;         // --mix-best: counts of best-probed heads, one row each
  bool mix_fit = false;              // --mix-fit: one more row, as many as the memory bounds take
  std::optional<int> mix_greedy;     // --mix-greedy: heads chosen one at a time
  std::vector<std::string> policies;
  std::vector<std::string> budgets;
  std::vector<int> recents;  // --recent: F32 recent windows, one row each
  bool retrieval_probe = false;
  int stream_tokens = 0;
  int segment_tokens = 512;
  int max_windows = 0;
  std::string csv_path;
  std::string json_path;
  std::string plot_prefix;
  bool plot_held = false;  // --plot-held: the plot's x axis is bits_at_ctx, not memory_bits
  // --max-dppl, --max-bits, --max-bits-at-ctx: choose the best row within these bounds;
  // --prefer: what "best" means (empty: DefaultObjective); --write-config: where the chosen
  // configuration goes as TOML (sweep_choice.h).
  ChoiceBounds choice_bounds;
  std::string prefer;
  std::string write_config_path;
  CacheFlags cache;
  EngineFlags engine;
};

// The configurations of the sweep: the base with each codec pair, recent window, policy and
// budget substituted ("full" takes no budget, so it appears once per codec pair and window;
// an evicting policy needs at least one budget). The codec pairs are --k-codec x --v-codec (or
// zipped with --pairs), then one K = V pair per --lowrank entry: a profiled codec's name, or a
// low-rank one's without its "lowrank-" (r4, r4-int4, e90).
absl::StatusOr<std::vector<KvConfig>> BuildGrid(const SweepFlags& flags, const KvConfig& base);

// The codecs of --probe-heads: "K:V", or "C" for both. Errors: one line naming the forms.
absl::StatusOr<std::pair<std::string, std::string>> ParseProbeHeads(const std::string& spec);

// --probe-heads rows: `first` (the grid's first configuration) once per (layer, kv head) of a
// model of that shape, that head alone stored with `codecs` (a head override that replaces
// any the base has for it), layer-major. Their ΔPPL against `first`'s ranks the heads by what
// the codecs are worth there: which to give more bits (or fewer) with --head-codec.
std::vector<KvConfig> HeadProbeRows(const KvConfig& first,
                                    const std::pair<std::string, std::string>& codecs,
                                    int num_layers, int num_kv_heads);

// The probe rows' indices, least ΔPPL first (ties keep layer-major order): the order in which
// --mix-best and --mix-fit give heads the probes' codecs.
std::vector<int> RankProbes(std::span<const double> probe_dppl);

// A memory bound for --mix-fit: the grid's first row's figure (memory_bits or bits_at_ctx),
// each probe row's (layer-major), and the most the mix may hold.
struct MixBudget {
  double first_bits = 0;
  std::span<const double> probe_bits;
  double max_bits = 0;
};

// --mix-fit: how many of the best-ranked heads a mix takes within every budget. A mix's figure
// is estimated as the first row's plus each chosen probe's difference from it (exact for
// memory_bits, an average over heads; for bits_at_ctx an estimate, since a head's codec may
// change its layer's F32 rows: the mix's own row measures it). Where the probes' codecs store
// at least as much as the first row's, the most heads that fit; where less, the fewest.
// nullopt: no count fits (0 may: the first row itself).
std::optional<int> FittingMixCount(std::span<const double> probe_dppl,
                                   std::span<const MixBudget> budgets);

// --mix-best rows: for each count N in `counts`, `first` with the N (layer, kv head) pairs
// whose probe rows lost least stored as `codecs`. `probe_dppl` is the probe rows' ΔPPL %,
// layer-major as HeadProbeRows makes them (ties keep that order). Each N is at most
// probe_dppl.size(). Ranking once and taking the best N assumes the heads' losses add up; the
// mixes' own rows measure whether they do.
std::vector<KvConfig> HeadMixRows(const KvConfig& first,
                                  const std::pair<std::string, std::string>& codecs,
                                  std::span<const double> probe_dppl, int num_kv_heads,
                                  std::span<const int> counts);

// `first` with the (layer, kv head) pairs `heads` stored as `codecs`; a head is a probe row's
// index, layer-major (layer * num_kv_heads + kv head).
KvConfig HeadMix(const KvConfig& first, const std::pair<std::string, std::string>& codecs,
                 std::span<const int> heads, int num_kv_heads);

// One round of --mix-greedy: the head it added, the mix with it (HeadMix's configuration, a row
// of the sweep, and its evaluation), and what each candidate's mix lost, ΔPPL % by probe index
// (NaN for the heads chosen in earlier rounds).
struct GreedyRound {
  int head = -1;
  KvConfig config;
  ConfigEvaluation mix;
  std::vector<double> candidate_dppl;
};
using EvaluateMixFn = std::function<absl::StatusOr<ConfigEvaluation>(const KvConfig&)>;

// --mix-greedy N: the heads of a mix chosen one at a time. Round 1's head is the best probe's
// (its mix is that probe row); each of rounds 2..N evaluates every head not yet chosen added to
// the chosen ones and keeps the one whose mix loses least (ties: the first, layer-major).
// Unlike --mix-best, which ranks the heads once and assumes their gains add up, each head is
// weighed with the earlier ones in place. Returns rounds 2..N; costs sum over r = 2..N of
// (probes - r + 1) evaluations. N: 2 .. probe_dppl.size().
absl::StatusOr<std::vector<GreedyRound>> GreedyMixRounds(
    const KvConfig& first, const std::pair<std::string, std::string>& codecs,
    std::span<const double> probe_dppl, int num_kv_heads, int num_heads,
    const EvaluateMixFn& evaluate);

// "k / v", then the head overrides ("head.L.H=K/V" for up to two, else "+N head overrides"),
// "+layer overrides" when layers override the codecs, "recent=R" when R tokens wait in F32,
// and "policy@budget" for evicting configurations.
std::string SweepLabel(const KvConfig& config);

// An output path must have an existing directory, checked before the sweep runs rather than
// discovered after it.
absl::Status CheckOutputPath(const std::string& flag, const std::string& path);
// Writes `text` to `path` ("-" = stdout); errors name the flag.
absl::Status WriteOutput(const std::string& flag, const std::string& path, const std::string& text);

// --stream: every configuration (and the F32 full cache) over one stream of
// options.ctx tokens, perplexity per segment.
absl::Status RunStreamSweep(const SweepFlags& flags, const KvConfig& base,
                            const std::vector<KvConfig>& grid, const LlamaModel& model,
                            std::span<const TokenId> tokens, const EvaluateOptions& options);

}  // namespace kvstack::cli
