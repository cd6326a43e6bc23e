// KvConfig: the whole design of a KV cache as one value — which tokens are kept (policy),
// how each vector is stored (codecs), and where and in what layout the bytes live. It is read
// from a TOML file or from CLI flags, validated in one place, and printed with every result so
// that a figure always names the configuration that produced it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

struct KvConfig {
  // Memory layout. Default: paged.
  LayoutKind layout = LayoutKind::kPaged;
  // Token slots per block (paged layout only). Default: 16. Allowed: 1..65536.
  int block_size = 16;
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
  // Selection policy (select/ layer) by name. Default: "full" (keep every token).
  std::string policy = "full";
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
  };
  std::vector<LayerCodecs> layer_codecs;
  // Calibration profile (`kvstack calibrate`) for low-rank codecs. Default: none.
  std::string profile;

  // The codec names of one layer, after overrides.
  const std::string& KCodecOf(int layer_idx) const;
  const std::string& VCodecOf(int layer_idx) const;

  // One line, `key=value` pairs, stable order: what reports print.
  std::string ToString() const;
};

// Checks every field against what is allowed; the error names the field and the allowed values.
absl::Status ValidateKvConfig(const KvConfig& config);

// Parses TOML text. Keys (all optional, defaults above): layout, block_size, k_codec, v_codec,
// capacity, max_sequences, policy, sink_tokens, recent_tokens, hadamard_keys, profile — at top
// level or under a [kv] table — and [kv.layer.N] tables with k_codec / v_codec. Unknown keys
// are an error (a typo must not silently leave a default in place). The result is validated.
absl::StatusOr<KvConfig> ParseKvConfigToml(std::string_view toml_text);
// Reads and parses a TOML file; errors name the path.
absl::StatusOr<KvConfig> LoadKvConfigFile(const std::string& path);

}  // namespace kvstack
