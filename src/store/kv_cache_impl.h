// KvCache::Impl: the state behind KvCache, shared by the files that implement it
// (kv_cache.cc: creation, sequences, planning, accounting; kv_cache_rows.cc: Write and View,
// the code that knows the sink / arena / pending segments; kv_cache_evict.cc: RetainTokens).
// Internal to src/store.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/large_buffer.h"
#include "kvstack/check.h"
#include "kvstack/kv_cache.h"

namespace kvstack {

// Arenas come from AllocateLargeBuffer (64-byte aligned for the kernels; huge pages from 2 MiB).
using ArenaPtr = std::unique_ptr<std::byte[], LargeBufferFree>;

struct KvCache::Impl {
  // The F32 side buffers of one sequence in one layer.
  struct SideBuffers {
    std::vector<float> sink_k;     // [num_kv_heads][sink_tokens][head_dim]; empty without sinks
    std::vector<float> sink_v;     // [num_kv_heads][sink_tokens][head_dim]
    std::vector<float> pending_k;  // [num_kv_heads][period][head_dim]; empty when period == 1
    std::vector<float> pending_v;  // [num_kv_heads][period][head_dim]
  };
  struct Sequence {
    std::vector<BlockId> block_table;  // physical blocks in logical order
    int num_tokens = 0;                // the most tokens any (layer, kv head) holds
    // Tokens each (layer, kv head) holds, [num_layers][num_kv_heads]; empty while every head
    // holds num_tokens (no eviction, or all heads evicted alike). Head h of layer l holds its
    // logical [0, n) in slots first_slot + [0, n): a head that holds fewer tokens than
    // num_tokens leaves the slots above its count unused.
    std::vector<int32_t> head_tokens;
    int first_slot = 0;  // ring only; 0 for the other layouts
    // Tokens ever appended: the absolute position of the next token. Equals num_tokens except
    // in a ring that has wrapped; it tells Write which tokens are sinks.
    int64_t num_appended = 0;
    std::vector<SideBuffers> layers;  // [num_layers]
  };
  struct Layer {
    // The layer's codecs (after config.layer_codecs overrides): every kv head's but those
    // config.head_codecs gives others, which head_codecs owns (one per side and name).
    std::unique_ptr<Codec> k_codec;
    std::unique_ptr<Codec> v_codec;
    std::vector<std::unique_ptr<Codec>> head_codecs;
    // Tokens held pending until every unit of the period fills: the longest unit of any head's
    // codecs (the others divide it).
    int period = 1;
    // Each kv head's one-head arena of keys and of values, [num_kv_heads]: its codec, unit size
    // and region. Arenas are head-major, [num_kv_heads][num_blocks][units of the head's codec]:
    // a head's consecutive blocks are adjacent, and its region follows the previous head's.
    // head_stride is a head's region: the distance to the next head's when that one has the
    // same codecs (always, when every head has the layer's).
    std::vector<KvArenaView> k_heads;
    std::vector<KvArenaView> v_heads;
    bool mixed = false;  // some kv head's codecs differ from another's
    ArenaPtr k;
    ArenaPtr v;

    // A joint (latent) layer encodes a token's key and value together into the key arena's
    // unit: its value arena is empty and its value views read the key arena (codec.h). Latent
    // codecs are never chosen per head, so a layer is joint in every head or in none.
    bool joint() const { return k_codec->joint(); }
    // The arena a value view reads.
    const ArenaPtr& v_arena() const { return joint() ? k : v; }
    // The mutable bytes at `address`, an address inside `arena` read through a view.
    static std::byte* Mutable(const ArenaPtr& arena, const std::byte* address) {
      return arena.get() + (address - arena.get());
    }
    // Bytes of one block in every kv head, keys and values (what the value arena holds).
    size_t BlockBytes() const {
      size_t bytes = 0;
      for (const KvArenaView& head : k_heads) bytes += head.block_stride;
      if (joint()) return bytes;
      for (const KvArenaView& head : v_heads) bytes += head.block_stride;
      return bytes;
    }
    // Encodes one head's keys and values into their units (v_dst is not written when joint).
    void EncodeHead(int kv_head, std::span<const float> k_src, std::span<const float> v_src,
                    std::span<std::byte> k_dst, std::span<std::byte> v_dst) const {
      const Codec& k_head_codec = *k_heads[kv_head].codec_impl;
      if (joint()) return k_head_codec.EncodeJointHead(kv_head, k_src, v_src, k_dst);
      k_head_codec.EncodeHead(kv_head, k_src, k_dst);
      v_heads[kv_head].codec_impl->EncodeHead(kv_head, v_src, v_dst);
    }
  };

  KvCacheOptions options;
  int block_size = 0;  // slots per block: config.block_size (paged) or capacity (others)
  BlockPool pool;
  std::vector<Layer> layers;
  absl::flat_hash_map<SeqId, Sequence> sequences;
  // Ids are never reused, so a plan or view of a removed sequence cannot silently apply to a
  // newer one.
  SeqId next_seq_id = 0;
  // The most BytesInUse() since creation or KvCache::ResetPeakBytesInUse: noted wherever
  // blocks or sequences are added (Insert, CommitAppend, Unshare).
  size_t peak_bytes_in_use = 0;

  explicit Impl(int32_t num_blocks) : pool(num_blocks) {}

  bool paged() const { return options.config.layout == LayoutKind::kPaged; }
  int sink_tokens() const { return options.config.sink_tokens; }

  const Sequence& Seq(SeqId seq_id) const {
    auto it = sequences.find(seq_id);
    KVS_CHECK(it != sequences.end());
    return it->second;
  }
  Sequence& MutableSeq(SeqId seq_id) {
    auto it = sequences.find(seq_id);
    KVS_CHECK(it != sequences.end());
    return it->second;
  }

  // The kv heads' token counts of one layer: empty while every head holds num_tokens.
  std::span<const int32_t> HeadTokensOf(const Sequence& seq, int layer_idx) const {
    if (seq.head_tokens.empty()) return {};
    return std::span(seq.head_tokens)
        .subspan(static_cast<size_t>(layer_idx) * options.num_kv_heads, options.num_kv_heads);
  }
  int recent_tokens() const { return options.config.recent_tokens; }
  // Rows of a layer's circular pending buffer: the recent window plus the unit still filling;
  // 0 when every token is encoded as it arrives.
  int PendingRows(const Layer& layer) const {
    return layer.period == 1 && recent_tokens() == 0 ? 0 : recent_tokens() + layer.period;
  }
  // Logical tokens [0, EncodedEnd) of a sequence of num_tokens are in the arena; the rest wait
  // in the pending buffer (whole units older than the recent window are encoded).
  int EncodedEnd(const Layer& layer, int num_tokens) const {
    return EncodedTokens(num_tokens, layer.period, recent_tokens());
  }
  // The fewest tokens any (layer, kv head) of the sequence holds encoded. Blocks below it
  // never change again while the heads only grow (appends write above it), so only they may
  // be shared between sequences.
  int MinEncodedTokens(const Sequence& seq) const {
    int fewest = seq.num_tokens;
    for (size_t layer_idx = 0; layer_idx < layers.size(); ++layer_idx) {
      const std::span<const int32_t> counts = HeadTokensOf(seq, static_cast<int>(layer_idx));
      const int held =
          counts.empty() ? seq.num_tokens : *std::min_element(counts.begin(), counts.end());
      fewest = std::min(fewest, EncodedEnd(layers[layer_idx], held));
    }
    return fewest;
  }
  // Encodes one period of kv head `kv_head` (logical tokens [first, first + layer.period) of
  // the sequence `view` shows, `first` a multiple of the period) from F32 rows, keys rotated
  // as stored ([period][head_dim] each), into its units in the layer's arenas. The rows of
  // sink tokens (logical < sink_tokens: read from their F32 copies, never from the arena) are
  // first replaced by the period's last row, so that their often extreme values do not widen
  // the scales the other tokens share: the rows are scratch. Write encodes a period when it
  // leaves the recent window; RetainTokens re-encodes those its moves change.
  void EncodePeriod(int layer_idx, const KvLayerView& view, int kv_head, int first,
                    std::span<float> k_rows, std::span<float> v_rows);

  // The two ways RetainTokens moves the kept tokens of one (layer, kv head) to logical
  // [0, keep.size()) (kv_cache_evict.cc): as bytes, row by row (layers of one-token units and
  // nothing pending), or through F32 from first_written on (a multiple of the period), whole
  // periods re-encoded and the rest pending. `view` shows the sequence before the move (counts
  // unchanged); rewrite, when set, changes keys from first_moved on.
  void MoveRows(int layer_idx, const KvLayerView& view, int kv_head, std::span<const int> keep,
                int first_moved, const KeyRewrite& rewrite);
  void RewriteThroughF32(Sequence& seq, int layer_idx, const KvLayerView& view, int kv_head,
                         std::span<const int> keep, int first_written, int first_moved,
                         const KeyRewrite& rewrite);

  // Empty side buffers of the right sizes for a new sequence.
  std::vector<SideBuffers> NewSideBuffers() const {
    const size_t row_floats = static_cast<size_t>(options.num_kv_heads) * options.head_dim;
    std::vector<SideBuffers> side(layers.size());
    for (size_t layer_idx = 0; layer_idx < layers.size(); ++layer_idx) {
      const size_t sink_floats = row_floats * sink_tokens();
      side[layer_idx].sink_k.resize(sink_floats);
      side[layer_idx].sink_v.resize(sink_floats);
      const int rows = PendingRows(layers[layer_idx]);
      side[layer_idx].pending_k.resize(row_floats * rows);
      side[layer_idx].pending_v.resize(row_floats * rows);
    }
    return side;
  }

  // Bytes of one block in every layer, keys and values.
  size_t BlockBytes() const {
    size_t bytes = 0;
    for (const Layer& layer : layers) bytes += layer.BlockBytes();
    return bytes;
  }
  size_t BytesInUse() const {
    const size_t num_used = static_cast<size_t>(pool.num_blocks() - pool.num_free());
    return num_used * BlockBytes() + sequences.size() * SideBytesPerSequence();
  }
  void NotePeak() { peak_bytes_in_use = std::max(peak_bytes_in_use, BytesInUse()); }

  // Bytes of one sequence's side buffers in all layers (the same for every sequence).
  size_t SideBytesPerSequence() const {
    const size_t row_floats = static_cast<size_t>(options.num_kv_heads) * options.head_dim;
    size_t floats = 0;
    for (const Layer& layer : layers) {
      floats += 2 * row_floats * (sink_tokens() + PendingRows(layer));
    }
    return floats * sizeof(float);
  }

  // Copies block `src` over block `dst` in every layer, keys and values: each kv head's part,
  // found through the heads' arena views (the one place that defines the arena layout).
  void CopyBlock(BlockId src, BlockId dst) {
    for (Layer& layer : layers) {
      for (int h = 0; h < options.num_kv_heads; ++h) {
        const auto copy = [&](const ArenaPtr& arena, const KvArenaView& head) {
          std::memcpy(Layer::Mutable(arena, head.Unit(dst, 0, 0)), head.Unit(src, 0, 0),
                      head.block_stride);
        };
        copy(layer.k, layer.k_heads[h]);
        if (!layer.joint()) copy(layer.v, layer.v_heads[h]);
      }
    }
  }

  // How many of block_table[begin, end) are shared with other sequences.
  int NumShared(const Sequence& seq, size_t begin, size_t end) const {
    int num_shared = 0;
    for (size_t idx = begin; idx < end; ++idx)
      num_shared += pool.ref_count(seq.block_table[idx]) > 1;
    return num_shared;
  }
  // Copy-on-write: gives the sequence its own copy of every shared block among
  // block_table[begin, end). The caller checked that NumShared of them are free.
  void Unshare(Sequence& seq, size_t begin, size_t end) {
    for (size_t idx = begin; idx < end; ++idx) {
      const BlockId shared = seq.block_table[idx];
      if (pool.ref_count(shared) == 1) continue;
      absl::StatusOr<BlockId> copy = pool.AllocateAfter(idx > 0 ? seq.block_table[idx - 1] : -1);
      KVS_CHECK(copy.ok());
      CopyBlock(shared, *copy);
      pool.Unref(shared);
      seq.block_table[idx] = *copy;
    }
    NotePeak();
  }

  SeqId Insert(Sequence seq) {
    const SeqId seq_id = next_seq_id++;
    sequences.emplace(seq_id, std::move(seq));
    NotePeak();
    return seq_id;
  }

  absl::StatusOr<BlockId> AllocateRegion() {
    absl::StatusOr<BlockId> block = pool.Allocate();
    if (!block.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv cache: all ", options.config.max_sequences,
          " sequence regions are in use (max_sequences=", options.config.max_sequences, ")"));
    }
    return block;
  }
};

}  // namespace kvstack
