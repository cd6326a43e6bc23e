// KvCache: owns the block pool, the per-layer key/value arenas and the per-sequence block
// tables (layer 3, memory architecture). Changing the cache is two steps, as in llama.cpp and
// vLLM: PlanAppend looks whether new tokens fit without side effects ("does not fit" is an
// answer, not an error), CommitAppend applies the plan. Then the engine writes the new tokens'
// rows layer by layer, and attention reads them through View(). Single-threaded by contract,
// except that View() and Write() of different layers may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvstack/block_pool.h"
#include "kvstack/codec.h"
#include "kvstack/kv_config.h"
#include "kvstack/kv_view.h"
#include "kvstack/status.h"

namespace kvstack {

using SeqId = int32_t;

struct KvCacheOptions {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // config.capacity must be resolved (> 0) before Create.
  KvConfig config;
};

// The result of PlanAppend. Pure data: planning changes nothing.
struct AppendPlan {
  SeqId seq_id = -1;
  int num_new_tokens = 0;
  int blocks_needed = 0;   // new blocks the commit will allocate
  int tokens_dropped = 0;  // ring only: oldest tokens the commit overwrites
  bool fits = false;       // false: not enough free blocks / ring too short for one call
};

class KvCache {
 public:
  // Validates the options (and the config through ValidateKvConfig), creates the codecs and
  // allocates every arena up front.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options);
  ~KvCache();

  // A new empty sequence. ResourceExhausted when max_sequences are live (contiguous, ring) or
  // when it could not get its first region.
  absl::StatusOr<SeqId> AddSequence();
  // Releases every block of the sequence. NotFound for an unknown id.
  absl::Status RemoveSequence(SeqId seq_id);
  // A new sequence sharing all of `seq_id`'s tokens (paged: full blocks shared by reference,
  // the partial tail block copied; other layouts: copied). Errors as AddSequence.
  absl::StatusOr<SeqId> ForkSequence(SeqId seq_id);

  // Side-effect free: would `num_new_tokens` more tokens fit? InvalidArgument only for an
  // unknown sequence or a count < 1.
  absl::StatusOr<AppendPlan> PlanAppend(SeqId seq_id, int num_new_tokens) const;
  // Applies a plan made against the current state (FailedPrecondition if it does not fit or
  // the state changed). Afterwards the new tokens are the last num_new_tokens logical tokens
  // of the sequence, their rows still to be written with Write().
  absl::Status CommitAppend(const AppendPlan& plan);

  // Encodes and stores rows for logical tokens [logical_begin, logical_begin + num_tokens).
  // k, v: [num_tokens, num_kv_heads, head_dim] floats. The range must lie inside the sequence.
  void Write(SeqId seq_id, int layer_idx, int logical_begin, std::span<const float> k,
             std::span<const float> v);

  // The read view of one sequence in one layer.
  KvLayerView View(SeqId seq_id, int layer_idx) const;
  int NumTokens(SeqId seq_id) const;

  const KvConfig& config() const;
  const Codec& k_codec() const;
  const Codec& v_codec() const;
  int num_layers() const;
  // K + V bytes of one token in all layers and kv heads, at the codecs' sizes.
  size_t bytes_per_token() const;
  // Bytes of all arenas (allocated up front).
  size_t bytes_reserved() const;
  // Bytes held by the blocks in use now.
  size_t bytes_in_use() const;
  const BlockPool& pool() const;

 private:
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstack
