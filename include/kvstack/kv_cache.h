// KvCache: owns the block pool, the per-layer key/value arenas and the per-sequence block
// tables (layer 3, memory architecture). Changing the cache is two steps, as in llama.cpp and
// vLLM: PlanAppend looks whether new tokens fit without side effects ("does not fit" is an
// answer, not an error), CommitAppend applies the plan. Then the engine writes the new tokens'
// rows layer by layer, and attention reads them through View(). Single-threaded by contract,
// except that View() and Write() of different layers may run concurrently.
//
// Codec units: a layer whose codec encodes T > 1 tokens per unit (or whose K and V codecs have
// different T) keeps the tokens of the unit still filling in an F32 "pending" buffer per
// sequence and layer; the period P = lcm(Tk, Tv) of a layer is the larger of the two (one must
// be a multiple of the other). With config.sink_tokens = S the first S tokens of a sequence are
// also kept in F32 side buffers (and in the arena, so that units stay whole). See kv_view.h
// for how the three segments are read.
//
// Ring with sinks (StreamingLLM's cache): the logical tokens of a ring are the S sinks followed
// by the most recent (capacity - S) tokens once the ring has wrapped. The ring's slots behind
// logical [0, S) still receive tokens as usual, but the view reads those positions from the
// sink buffers, so the tokens written there are dropped. The ring needs one-token units.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
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
  // Content hash of the model the cache serves (GgufFile::ContentHash): a calibration profile
  // must have been measured on this model. Default: 0 (no profile can match).
  uint64_t model_hash = 0;
  // Creates each layer's codecs from their names. Tests inject codecs the registry does not
  // have through it (e.g. a multi-token unit format). Default (empty): CreateCodec.
  std::function<absl::StatusOr<std::unique_ptr<Codec>>(std::string_view name, int head_dim,
                                                       CodecRole role)>
      codec_factory;
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
  // Keys are rotated first when config.hadamard_keys is set. A unit is encoded when its last
  // token is written, from the pending buffer: the tokens of one unit must be written in
  // order (as appends do), each once.
  void Write(SeqId seq_id, int layer_idx, int logical_begin, std::span<const float> k,
             std::span<const float> v);

  // The read view of one sequence in one layer (head_tokens filled once a head was evicted).
  KvLayerView View(SeqId seq_id, int layer_idx) const;
  // Token slots the sequence uses: the most tokens any (layer, kv head) holds. Appends and
  // Write count in these slots; see RetainTokens for heads that hold fewer.
  int NumTokens(SeqId seq_id) const;
  // Tokens one kv head of one layer holds: NumTokens until an eviction kept fewer.
  int HeadTokens(SeqId seq_id, int layer_idx, int kv_head) const;

  // Eviction (layer 1 decides which tokens, the cache applies it), in every layout and with
  // every codec. Called for every kept key while it moves: its F32 value (Hadamard rotation
  // undone), its logical index before and after. It may change the key (re-assigning RoPE
  // positions); the key is then re-encoded. Not set: keys move as stored bytes, bit for bit.
  using KeyRewrite = std::function<void(int old_index, int new_index, std::span<float> key)>;
  // Keeps only the logical tokens `keep` (ascending, distinct, < HeadTokens) of one kv head in
  // one layer: they become logical [0, keep.size()) in order, every other token of that head is
  // gone. Sink tokens (logical < config.sink_tokens) must be kept. Afterwards, NumTokens is the
  // new maximum over all layers and heads, and blocks beyond it are freed (paged); shared
  // (forked) blocks are copied before they change. Appends then grow every head by the same
  // count: Write's logical_begin is in NumTokens' numbering, and a head holding n tokens stores
  // written token logical_begin + j at its logical n - (NumTokens - logical_begin) + j.
  // A ring's heads stop growing once it is full (its oldest tokens go instead), so there a
  // head must keep at least sink_tokens + 1 tokens (its newest stays visible).
  // One-token units move as bytes. Units of several tokens (KIVI keys, int4 groups longer than
  // a row) and a recent window cannot lose one token: from the period holding the first moved
  // token on, the kept tokens are decoded and encoded again in their new periods (re-rounded;
  // tokens still pending stay exact F32).
  // Errors: InvalidArgument for a bad keep list; ResourceExhausted when
  // shared blocks must be copied and too few are free; nothing changes on error.
  absl::Status RetainTokens(SeqId seq_id, int layer_idx, int kv_head, std::span<const int> keep,
                            const KeyRewrite& rewrite = nullptr);

  // The configuration the cache was created with, block_size resolved (never 0).
  const KvConfig& config() const;
  // The codecs of one kv head of one layer (after config.layer_codecs and config.head_codecs
  // overrides).
  const Codec& k_codec(int layer_idx = 0, int kv_head = 0) const;
  const Codec& v_codec(int layer_idx = 0, int kv_head = 0) const;
  // Tokens of one layer that are encoded together (KvLayerView::pending_period): the longest
  // unit among its kv heads' codecs, a multiple of every other.
  int unit_period(int layer_idx) const;
  int num_layers() const;
  // K + V bytes of one token in all layers and kv heads at the codecs' sizes: the sum over
  // layers and kv heads of k.unit_bytes / Tk + v.unit_bytes / Tv (a joint unit counted once).
  // Fractional when a unit's bytes do not divide evenly among its tokens. F32 sink and pending
  // buffers not counted.
  double bytes_per_token() const;
  // Storage bits per element, averaged over keys and values and all layers.
  double bits_per_element() const;
  // Bytes of all arenas (allocated up front).
  size_t bytes_reserved() const;
  // Bytes held by the blocks in use now plus the F32 sink and pending buffers of the live
  // sequences (f32_row_bytes_in_use).
  size_t bytes_in_use() const;
  // Bytes of the live sequences' F32 sink and pending buffers (sink_tokens, and per layer the
  // recent window plus a unit still filling): room for rows not yet encoded, outside the arenas
  // and so outside bytes_reserved.
  size_t f32_row_bytes_in_use() const;
  // The most bytes_in_use() since the cache was created or ResetPeakBytesInUse was last called
  // (what a run needed at its fullest, e.g. a forward call's new tokens before an evicting
  // policy trims them).
  size_t peak_bytes_in_use() const;
  // Starts the peak again from the bytes in use now.
  void ResetPeakBytesInUse();
  const BlockPool& pool() const;

 private:
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstack
