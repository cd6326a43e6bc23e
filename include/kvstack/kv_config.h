// KvConfig: the whole design of a KV cache as one value — which tokens are kept (policy),
// how each vector is stored (codecs), and where and in what layout the bytes live. It is read
// from a TOML file or from CLI flags, validated in one place, and printed with every result so
// that a figure always names the configuration that produced it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/policy.h"
#include "kvstack/status.h"

namespace kvstack {

// How a sequence's tokens map onto cache memory. Persisted in reports: values are append-only.
enum class LayoutKind : uint8_t {
  kContiguous = 0,  // one region of `capacity` slots reserved per sequence
  kPaged = 1,       // blocks of `block_size` slots from a shared pool, through a block table
  kRing = 2,        // one region of `capacity` slots per sequence; writes wrap, oldest overwritten
};

std::string_view LayoutName(LayoutKind layout);
absl::StatusOr<LayoutKind> ParseLayout(std::string_view name);  // "contiguous" | "paged" | "ring"

// How many tokens an eviction policy keeps per kv head: a count, a fraction of the context, or
// bytes of cache per sequence (all layers, keys and values, at the codecs' sizes).
struct KvBudget {
  enum class Kind : uint8_t { kNone = 0, kTokens = 1, kFraction = 2, kBytes = 3 };
  Kind kind = Kind::kNone;
  double value = 0;  // tokens (integer), fraction in (0, 1], or bytes (integer)

  bool is_set() const { return kind != Kind::kNone; }
  // Tokens per kv head for a context of `context_tokens` and a cache whose token costs
  // `bytes_per_token` (KvCache::bytes_per_token). At least 1 when set.
  int Resolve(int context_tokens, double bytes_per_token) const;
  // "256", "50%", "64KiB"; "" when not set.
  std::string ToString() const;

  bool operator==(const KvBudget&) const = default;
};
// Parses "256" (tokens), "50%" or "0.5" (fraction of the context), "4096B", "64KiB", "2MiB"
// (bytes). Errors: one line naming the forms allowed; zero and negative budgets.
absl::StatusOr<KvBudget> ParseKvBudget(std::string_view text);

// Token slots per block of the paged layout: what block_size 0 starts from, and the largest.
inline constexpr int kDefaultBlockSize = 16;
inline constexpr int kMaxBlockSize = 65536;

struct KvConfig {
  // Memory layout. Default: paged.
  LayoutKind layout = LayoutKind::kPaged;
  // Token slots per block (paged layout only). 0 means kDefaultBlockSize, or, where a layer's
  // codecs group more tokens per unit (KIVI's -g, integer groups longer than a row), the
  // smallest multiple of every layer's unit that is at least kDefaultBlockSize; KvCache::Create
  // resolves it. A size given that is not a multiple of some unit is an error. Default: 0.
  // Allowed: 0..kMaxBlockSize.
  int block_size = 0;
  // Storage codec of keys and of values, by name (see codec.h: "f32", "f16", "bf16").
  // Default: "f16" for both, the format llama.cpp uses by default.
  std::string k_codec = "f16";
  std::string v_codec = "f16";
  // Token slots per sequence: the reservation (contiguous), the ring length (ring), or the
  // share of the pool (paged: the pool holds capacity * max_sequences slots, rounded up to
  // whole blocks, shared by all sequences). 0 means "what the run needs", resolved by the
  // engine before the cache is created. Default: 0.
  int64_t capacity = 0;
  // Sequences the cache can hold at once. Default: 1.
  int max_sequences = 1;
  // Selection policy (select/ layer, see policy.h) by name. Default: "full" (keep every token).
  std::string policy = "full";
  // What an eviction policy keeps per kv head (required by every policy but "full", which
  // refuses one). The layer schedule and head split spread it (policy.h).
  KvBudget budget;
  std::string layer_budget = "uniform";  // "uniform" | "pyramid"
  // How many decode steps one eviction serves: a kv head over its budget is cut to
  // budget + 1 - evict_step tokens, so it holds between that and the budget, and its rows
  // (an O(tokens) move) move once per evict_step steps. 1: every step, exactly the budget
  // (the classic policies). 0: budget / 16, between 1 and 128. Default: 0.
  int evict_step = 0;
  std::string head_budget = "uniform";  // "uniform" | "adaptive"
  // Policy parameters (PolicyParams): sinks and recent tokens the policy always keeps (-1:
  // half the budget), SnapKV's observation window and pooling width.
  int policy_sinks = 4;
  int policy_recent = -1;
  int observation_window = 32;
  int pool_kernel = 7;
  // How the query heads sharing a kv head combine their scores: "max" | "mean".
  std::string score_aggregation = "max";
  // RoPE positions of the kept tokens: "original" (each keeps the position it was computed
  // at) or "reassign" (StreamingLLM: positions are the tokens' places in the cache, keys are
  // re-rotated when they move, and new tokens get the next place; needs the same token count
  // in every kv head, so not with head_budget adaptive or policy duo).
  std::string positions = "original";
  // DuoAttention-style head classes (policy "duo"): the profile from `kvstack calibrate
  // --heads` and the fraction of kv heads, by retrieval score, that keep everything.
  std::string head_profile;
  double retrieval_fraction = 0.25;
  // The first sink_tokens tokens of every sequence are kept in full precision (F32) whatever
  // the codecs. Default: 0.
  int sink_tokens = 0;
  // The most recent tokens kept in full precision (F32) before they are encoded — KIVI's
  // residual window. A multiple of every layer's unit period; not with the ring layout.
  // Default: 0.
  int recent_tokens = 0;
  // Rotate keys by an orthonormal Hadamard matrix before encoding (spreads outlier channels
  // across the group; head_dim must be a power of two). Default: false.
  bool hadamard_keys = false;
  // Per-layer codec choices that replace k_codec / v_codec for one layer. An empty string
  // keeps the default. Flag: --layer-codec L:K:V (repeatable); TOML: [kv.layer.L] k_codec=...
  struct LayerCodecs {
    int layer_idx = 0;
    std::string k_codec;
    std::string v_codec;
    std::string policy;  // empty: the default policy

    bool operator==(const LayerCodecs&) const = default;
  };
  std::vector<LayerCodecs> layer_codecs;
  // Per-kv-head codec choices that replace the layer's codecs for one kv head of one layer,
  // e.g. a head whose keys have outlier channels kept in int8 while the others are int4. An
  // empty string keeps the layer's codec. Not with latent codecs (one joint basis per layer).
  // Flag: --head-codec L:H:K:V (repeatable); TOML: [kv.layer.L.head.H] k_codec=...
  struct HeadCodecs {
    int layer_idx = 0;
    int kv_head = 0;
    std::string k_codec;
    std::string v_codec;

    bool operator==(const HeadCodecs&) const = default;
  };
  std::vector<HeadCodecs> head_codecs;
  // Calibration profile (`kvstack calibrate`) for low-rank and latent codecs. Default: none.
  std::string profile;

  // The codec names of one layer, after layer overrides, and of one kv head of it, after head
  // overrides.
  const std::string& KCodecOf(int layer_idx) const;
  const std::string& VCodecOf(int layer_idx) const;
  const std::string& KCodecOf(int layer_idx, int kv_head) const;
  const std::string& VCodecOf(int layer_idx, int kv_head) const;
  const std::string& PolicyOf(int layer_idx) const;
  // Whether some layer's policy evicts (is not "full").
  bool evicts() const;
  // Whether `name` is the policy of some layer.
  bool PolicyUsed(std::string_view name) const;

  // One line, `key=value` pairs, stable order: what reports print.
  std::string ToString() const;

  // Field by field (override lists in order).
  bool operator==(const KvConfig&) const = default;
};

// The policy parameters a config sets (policy_sinks, policy_recent, observation_window,
// pool_kernel).
PolicyParams PolicyParamsOf(const KvConfig& config);

// Checks every field against what is allowed; the error names the field and the allowed values.
absl::Status ValidateKvConfig(const KvConfig& config);

// Parses TOML text. Keys (all optional, defaults above): layout, block_size, k_codec, v_codec,
// capacity, max_sequences, policy, sink_tokens, recent_tokens, hadamard_keys, profile, budget
// (integer tokens or a string as ParseKvBudget takes), layer_budget, head_budget, evict_step,
// policy_sinks, policy_recent, observation_window, pool_kernel, score_aggregation, positions,
// head_profile, retrieval_fraction — at top level or under a [kv] table — [kv.layer.N]
// tables with k_codec / v_codec / policy, and [kv.layer.N.head.H] tables with k_codec /
// v_codec. Unknown keys
// are an error (a typo must not silently leave a default in place). The result is validated.
absl::StatusOr<KvConfig> ParseKvConfigToml(std::string_view toml_text);
// Reads and parses a TOML file; errors name the path.
absl::StatusOr<KvConfig> LoadKvConfigFile(const std::string& path);

// `config` as a TOML document: a [kv] table with every field (the budget only when set), one
// [kv.layer.N] table per layer override and one [kv.layer.N.head.H] table per head override,
// in the order of their lists. ParseKvConfigToml reads it back to a config equal to `config`
// (doubles are written to round-trip, strings escaped as TOML requires), so that a design
// chosen by `kvstack sweep --write-config` runs as measured. `config` must be valid.
std::string KvConfigToml(const KvConfig& config);

}  // namespace kvstack
