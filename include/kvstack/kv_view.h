// KvLayerView: the non-owning read view of one sequence's keys and values in one layer, in
// their stored (encoded) format. Contiguous, paged and ring layouts all produce this one view;
// every attention kernel reads through it. Plain data, passed by value; valid until the cache
// that produced it is next modified.
//
// Three segments, in logical order (oldest first):
//   sinks   [0, sinks.end)              F32 copies of the first tokens (attention sinks), when
//                                       the config keeps sinks in full precision;
//   arena   [sinks.end, pending.begin)  encoded units in the blocks;
//   pending [pending.begin, num_tokens) F32 tokens not yet encoded: the unit still filling
//                                       (codecs whose units hold several tokens) and the
//                                       most recent `recent_tokens` (KIVI's residual).
// Either F32 segment may be empty. Arena addressing: logical token i lives in slot
//   s = (first_slot + i) % (block_table.size() * block_size)
// i.e. in physical block block_table[s / block_size], row r = s % block_size, which belongs to
// unit r / group_tokens of that block (units never straddle blocks: block_size is a multiple
// of group_tokens). Inside an arena, block b's units for kv head h start at
//   base + b * block_stride + h * head_stride, one unit every unit_bytes.
// KvCache's arenas are head-major (head_stride = num_blocks * block_stride): a head's blocks
// with consecutive ids are adjacent, so a sequence allocated in order reads as one run per head.
// A layer whose kv heads use different codecs (KvConfig::head_codecs) has no one head_stride:
// its view lists one arena per head (head_k, head_v), and readers take head h's through
// KeyArena(h) / ValueArena(h), HeadView(h), or HeadsView for a run of heads that read alike.
// Contiguous: one block of `capacity` slots, first_slot 0. Paged: many blocks, first_slot 0.
// Ring: one block of `capacity` slots; first_slot moves once the ring has wrapped.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "kvstack/check.h"
#include "kvstack/codec.h"

namespace kvstack {

// One arena (keys or values) of one layer.
struct KvArenaView {
  const std::byte* base =
      nullptr;              // units at Unit(block, unit, head); KvCache: [head][block][unit]
  size_t block_stride = 0;  // bytes between consecutive physical blocks of one kv head
  size_t head_stride = 0;   // bytes between kv heads at the same block
  size_t unit_bytes = 0;    // bytes per unit (group_tokens tokens of one head)
  int group_tokens = 1;     // tokens per unit
  CodecId codec = CodecId::kF32;
  const Codec* codec_impl = nullptr;  // the codec itself, for generic paths and references

  const std::byte* Unit(int32_t block_id, int unit_idx, int kv_head) const {
    return base + static_cast<size_t>(block_id) * block_stride +
           static_cast<size_t>(kv_head) * head_stride + static_cast<size_t>(unit_idx) * unit_bytes;
  }
  // The row of one token; only for codecs with one-token units.
  const std::byte* Row(int32_t block_id, int row, int kv_head) const {
    KVS_DCHECK(group_tokens == 1);
    return Unit(block_id, row, kv_head);
  }
};

// Tokens [0, EncodedTokens) of a head holding n tokens are encoded in the arena; the rest wait
// in F32 (the pending segment): tokens older than the newest `recent` are encoded in whole
// periods of `period` tokens (the lcm of the key and value unit lengths), the others wait.
// period 1 and recent 0: every token is encoded as it arrives.
inline int EncodedTokens(int n, int period, int recent) {
  const int settled = n - recent;
  return settled <= 0 ? 0 : settled - settled % period;
}

// Full-precision (F32) tokens kept outside the arenas.
struct KvF32Segment {
  const float* k = nullptr;  // [num_kv_heads][stride_tokens][head_dim]
  const float* v = nullptr;  // [num_kv_heads][stride_tokens][head_dim]
  int stride_tokens = 0;     // buffer rows per kv head (a circular buffer)
  int origin = 0;            // logical index stored in buffer row 0; logical i is in row
                             // (i - origin) % stride_tokens
  int begin = 0;             // logical range [begin, end) held here
  int end = 0;

  int num_tokens() const { return end - begin; }
  const float* KRow(int logical, int kv_head, int head_dim) const {
    return k + Offset(logical, kv_head, head_dim);
  }
  const float* VRow(int logical, int kv_head, int head_dim) const {
    return v + Offset(logical, kv_head, head_dim);
  }
  size_t Offset(int logical, int kv_head, int head_dim) const {
    KVS_DCHECK(begin <= logical && logical < end && logical >= origin);
    return (static_cast<size_t>(kv_head) * stride_tokens + (logical - origin) % stride_tokens) *
           head_dim;
  }
};

struct KvLayerView {
  KvArenaView k;
  KvArenaView v;
  std::span<const int32_t> block_table;  // [num_blocks] physical block ids, logical order
  int block_size = 0;                    // slots per block
  int first_slot = 0;                    // slot of logical token 0
  int num_tokens = 0;                    // valid logical tokens
  int num_kv_heads = 0;
  int head_dim = 0;
  KvF32Segment sinks;    // [0, sinks.end); empty when no sinks are kept
  KvF32Segment pending;  // [pending.begin, num_tokens); empty when every unit is complete
  // Keys are stored rotated by the orthonormal Hadamard matrix H (k' = H k): attention must
  // rotate each query the same way (q.k = Hq.Hk). Values are never rotated.
  bool keys_rotated = false;
  // Tokens each kv head holds. An eviction policy (layer 1) may keep different tokens, and
  // different numbers of them, per kv head: head h's logical tokens are [0, head_tokens[h])
  // (each <= num_tokens). Empty: every head holds num_tokens. A cache never evicts sinks, so
  // heads share the sinks segment; each head's pending segment follows its own count (the rule
  // of EncodedTokens with pending_period and pending_recent; HeadView applies it), and the
  // pending segment above describes a head holding num_tokens.
  std::span<const int32_t> head_tokens;
  int pending_period = 1;  // the layer's period: lcm of the key and value unit lengths
  int pending_recent = 0;  // tokens kept in F32 after the last whole period (KIVI's residual)
  // The cache's kv head that this view's head 0 is (non-zero in a HeadView): codecs with
  // per-head parameters (low-rank bases) are called with first_kv_head + h.
  int first_kv_head = 0;
  // Per-kv-head arenas, [num_kv_heads] each, of a layer whose heads do not all use the same
  // codecs: head h's keys are in head_k[h] and its values in head_v[h], each a one-head arena
  // (its units at Unit(block, unit, 0)) whose head_stride is the distance to the next head's
  // region if that head has the same codecs (as the codec_impl pointers say): a run of such
  // heads reads as one view (HeadsView). k and v are head 0's, and no reader may address
  // another head through them. Empty: every head is in k and v at its head_stride.
  std::span<const KvArenaView> head_k;
  std::span<const KvArenaView> head_v;

  int HeadTokens(int kv_head) const {
    return head_tokens.empty() ? num_tokens : head_tokens[kv_head];
  }
  // Whether the kv heads use different codecs (head_k and head_v are set).
  bool mixed_codecs() const { return !head_k.empty(); }
  // Whether the attention kernels can read the view whole: every kv head holds all num_tokens
  // tokens, in arenas of one codec. Otherwise each run of heads that read alike (SameHeads) is
  // read as its own HeadsView.
  bool uniform_heads() const {
    return !mixed_codecs() && std::all_of(head_tokens.begin(), head_tokens.end(),
                                          [&](int32_t n) { return n == num_tokens; });
  }
  // The one-head arena of kv head `kv_head`'s keys or values: its units at Unit(block, unit, 0).
  KvArenaView KeyArena(int kv_head) const { return OneHead(k, head_k, kv_head); }
  KvArenaView ValueArena(int kv_head) const { return OneHead(v, head_v, kv_head); }
  // Whether kv heads a and b read alike: the same codecs, and the same number of tokens.
  bool SameHeads(int a, int b) const {
    if (HeadTokens(a) != HeadTokens(b)) return false;
    return !mixed_codecs() || (head_k[a].codec_impl == head_k[b].codec_impl &&
                               head_v[a].codec_impl == head_v[b].codec_impl);
  }
  // The view of kv heads [first, first + count), which read alike (SameHeads), holding their
  // HeadTokens(first) tokens: a uniform view the kernels read whole.
  KvLayerView HeadsView(int first, int count) const {
    KVS_DCHECK(0 <= first && count >= 1 && first + count <= num_kv_heads);
    KVS_DCHECK(SameHeads(first, first + count - 1));
    KvLayerView run = *this;
    const int n = HeadTokens(first);
    run.k = KeyArena(first);
    run.v = ValueArena(first);
    run.head_k = {};
    run.head_v = {};
    run.num_tokens = n;
    run.num_kv_heads = count;
    run.head_tokens = {};
    run.first_kv_head = first_kv_head + first;
    for (KvF32Segment* seg : {&run.sinks, &run.pending}) {
      const size_t head_floats = static_cast<size_t>(first) * seg->stride_tokens * head_dim;
      if (seg->k != nullptr) seg->k += head_floats;
      if (seg->v != nullptr) seg->v += head_floats;
      seg->end = std::min(seg->end, n);
      seg->begin = std::min(seg->begin, seg->end);
    }
    // The heads' own encoded end; sinks win where the two overlap (a sink is never pending).
    run.pending.begin = std::min(
        run.pending.end, std::max(run.sinks.end, EncodedTokens(n, pending_period, pending_recent)));
    return run;
  }
  // The one-head view of kv head `kv_head`, holding its HeadTokens(kv_head) tokens.
  KvLayerView HeadView(int kv_head) const { return HeadsView(kv_head, 1); }

  int num_slots() const { return static_cast<int>(block_table.size()) * block_size; }
  // The unit of `arena` (this view's k or v) holding logical token `logical` of kv head
  // `kv_head`, at the slot the header defines.
  const std::byte* UnitOf(const KvArenaView& arena, int logical, int kv_head) const {
    const int slot = (first_slot + logical) % num_slots();
    return arena.Unit(block_table[slot / block_size], slot % block_size / arena.group_tokens,
                      kv_head);
  }
  // The logical range held in the arenas.
  int arena_begin() const { return sinks.end; }
  int arena_end() const { return pending.end > pending.begin ? pending.begin : num_tokens; }

  // Logical tokens [logical, logical + count) at rows [row, row + count) of block block_id.
  struct Run {
    int count = 0;
    int32_t block_id = 0;
    int row = 0;
  };
  // The longest run of logical tokens from `logical` (< end) in consecutive rows of one block.
  Run RunAt(int logical, int end) const {
    const auto [index, row] = BlockIndexAndRow(logical, end);
    return {std::min(end - logical, block_size - row), block_table[index], row};
  }
  // Calls fn(logical_begin, count, block_id, row_begin) for maximal runs of logical tokens
  // [begin, end) that sit in consecutive rows of one block, in logical order.
  template <typename Fn>
  void ForEachRun(int begin, int end, Fn&& fn) const {
    KVS_DCHECK(0 <= begin && begin <= end && end <= num_tokens);
    for (int i = begin; i < end;) {
      const Run run = RunAt(i, end);
      fn(i, run.count, run.block_id, run.row);
      i += run.count;
    }
  }
  // RunAt for one arena, carried on over the blocks whose units follow the run's back to back
  // in it (the next physical block, where a block's units of one head fill its block_stride:
  // KvCache's head-major arenas with blocks taken in order). The run's units are then
  // consecutive from arena.Unit(block_id, row / group_tokens, head): a reader fills a whole
  // run with one stride instead of a call per block. (Not for ForEachRun's callers that
  // write a block at a time.)
  Run ArenaRunAt(const KvArenaView& arena, int logical, int end) const {
    const auto [index, row] = BlockIndexAndRow(logical, end);
    Run run{std::min(end - logical, block_size - row), block_table[index], row};
    const int units = block_size / arena.group_tokens;
    if (block_size % arena.group_tokens != 0 ||
        arena.block_stride != static_cast<size_t>(units) * arena.unit_bytes) {
      return run;
    }
    // (No division per block: a tile of a paged cache spans many.)
    for (size_t next = index + 1; logical + run.count < end && next < block_table.size() &&
                                  block_table[next] == block_table[next - 1] + 1;
         ++next) {
      run.count += std::min(end - logical - run.count, block_size);
    }
    return run;
  }

 private:
  // The index into block_table of the block that holds logical token `logical` (< end), and
  // its row there.
  std::pair<size_t, int> BlockIndexAndRow(int logical, int end) const {
    KVS_DCHECK(0 <= logical && logical < end && end <= num_tokens);
    int slot = first_slot + logical;
    if (slot >= num_slots()) slot -= num_slots();
    return {static_cast<size_t>(slot / block_size), slot % block_size};
  }
  KvArenaView OneHead(const KvArenaView& whole, std::span<const KvArenaView> per_head,
                      int kv_head) const {
    KVS_DCHECK(0 <= kv_head && kv_head < num_kv_heads);
    if (!per_head.empty()) return per_head[kv_head];
    KvArenaView one = whole;
    one.base += static_cast<size_t>(kv_head) * whole.head_stride;
    return one;
  }
};

}  // namespace kvstack
