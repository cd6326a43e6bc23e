// KvCache::RetainTokens: the cache's side of eviction. Layer 1 (src/select) decides which
// tokens one (layer, kv head) keeps; here the kept rows move forward, in logical order, to
// logical [0, kept), in whatever layout the cache has (the slot of a logical token is the one
// kv_view.h defines, so contiguous, paged and ring move alike).
//
// Two ways to move, by what a layer stores:
// - one-token units, nothing pending: rows move as bytes (bit for bit, re-encoded only when a
//   rewrite changes the key). Since `keep` is ascending, a row's source is never a row an
//   earlier move wrote, so the moves are safe in place.
// - units of several tokens (KIVI keys, int4 groups longer than a row) or a recent window:
//   a unit cannot lose one token, so from the period holding the first moved token on, the
//   kept tokens are read in F32 (sink copies, decoded units, pending rows), and written back:
//   whole periods below the head's new encoded end are encoded again, the rest wait in the
//   pending buffer. Tokens that were encoded are re-rounded when encoded again, except where
//   a whole encoded period moves unchanged: its bytes move as they are.
// Sinks (logical [0, S), always kept) never move, so their F32 copies stay valid. Moves change
// rows only of this head, but blocks are shared by all heads and layers: a block shared with a
// forked sequence is copied first, and blocks above the new NumTokens are returned to the pool.
#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstack/kv_cache.h"
#include "represent/hadamard.h"
#include "store/kv_cache_impl.h"

namespace kvstack {

absl::Status KvCache::RetainTokens(SeqId seq_id, int layer_idx, int kv_head,
                                   std::span<const int> keep, const KeyRewrite& rewrite) {
  auto it = impl_->sequences.find(seq_id);
  if (it == impl_->sequences.end()) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: no sequence with id ", seq_id));
  }
  const int num_kv_heads = impl_->options.num_kv_heads;
  if (layer_idx < 0 || layer_idx >= num_layers() || kv_head < 0 || kv_head >= num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: cannot evict in layer ", layer_idx, ", kv head ", kv_head,
        "; allowed: layers 0..", num_layers() - 1, ", kv heads 0..", num_kv_heads - 1));
  }
  Impl::Sequence& seq = it->second;
  const int held = HeadTokens(seq_id, layer_idx, kv_head);
  const int num_kept = static_cast<int>(keep.size());
  for (int i = 0; i < num_kept; ++i) {
    if (keep[i] < 0 || keep[i] >= held || (i > 0 && keep[i] <= keep[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv cache: keep[", i, "] = ", keep[i], " in layer ", layer_idx, ", kv head ", kv_head,
          "; allowed: ascending, distinct logical tokens in [0, ", held, ")"));
    }
  }
  // Ascending and distinct, so keep[sinks - 1] == sinks - 1 means all of [0, sinks) are kept.
  const int num_sinks = std::min(impl_->sink_tokens(), held);
  if (num_sinks > 0 && (num_kept < num_sinks || keep[num_sinks - 1] != num_sinks - 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: the keep list of layer ", layer_idx, ", kv head ", kv_head,
                     " drops a sink token; allowed: lists that keep logical 0..", num_sinks - 1,
                     " (sink_tokens ", impl_->sink_tokens(), ")"));
  }
  // A full ring does not grow its heads (first_slot moves instead), so a head's newest token
  // replaces its oldest non-sink one; a head holding only its sinks would have no place left
  // for the token just appended, and attention would not see it.
  const int ring_minimum = std::min(impl_->sink_tokens() + 1, held);
  if (impl_->options.config.layout == LayoutKind::kRing && num_kept < ring_minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: the keep list of layer ", layer_idx, ", kv head ", kv_head,
                     " keeps ", num_kept, " tokens; allowed in a ring: at least ", ring_minimum,
                     " (the sinks and one more: a full ring's heads do not grow)"));
  }

  // The new counts and what they free or need, worked out before anything changes.
  std::vector<int32_t> counts = seq.head_tokens;
  if (counts.empty()) counts.assign(static_cast<size_t>(num_layers()) * num_kv_heads, held);
  counts[static_cast<size_t>(layer_idx) * num_kv_heads + kv_head] = num_kept;
  const int new_num_tokens = *std::max_element(counts.begin(), counts.end());
  int first_moved = 0;  // rows before it keep their place
  while (first_moved < num_kept && keep[first_moved] == first_moved) ++first_moved;
  const Impl::Layer& layer = impl_->layers[layer_idx];
  const bool through_f32 = impl_->PendingRows(layer) > 0;
  // Rows from first_written on change now or with this head's next appends and encodes: those
  // above the new count, and in a pending layer those from its new encoded end (tokens that
  // were encoded may wait in F32 again) and the whole period holding first_moved.
  const int first_written = through_f32 ? std::min(first_moved / layer.period * layer.period,
                                                   impl_->EncodedEnd(layer, num_kept))
                                        : first_moved;
  // Paged: blocks above the new maximum are freed, and every remaining block from the one
  // holding first_written must be this sequence's own (copy-on-write).
  const size_t blocks_kept =
      impl_->paged()
          ? static_cast<size_t>((new_num_tokens + impl_->block_size - 1) / impl_->block_size)
          : seq.block_table.size();
  const size_t first_written_block = std::min(
      blocks_kept, static_cast<size_t>(first_written) / static_cast<size_t>(impl_->block_size));
  const int num_copies = impl_->NumShared(seq, first_written_block, blocks_kept);
  if (num_copies > impl_->pool.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache: cannot evict in sequence ", seq_id, ": ", num_copies,
        " shared blocks must be copied first and only ", impl_->pool.num_free(), " are free"));
  }

  impl_->Unshare(seq, first_written_block, blocks_kept);
  const KvLayerView view = View(seq_id, layer_idx);  // after the copies: their block ids
  if (through_f32) {
    impl_->RewriteThroughF32(seq, layer_idx, view, kv_head, keep, first_written, first_moved,
                             rewrite);
  } else {
    impl_->MoveRows(layer_idx, view, kv_head, keep, first_moved, rewrite);
  }

  // Back to the compact form once every head holds the maximum again.
  const bool uniform =
      std::all_of(counts.begin(), counts.end(), [&](int32_t n) { return n == new_num_tokens; });
  seq.head_tokens = uniform ? std::vector<int32_t>() : std::move(counts);
  seq.num_tokens = new_num_tokens;
  while (seq.block_table.size() > blocks_kept) {
    impl_->pool.Unref(seq.block_table.back());
    seq.block_table.pop_back();
  }
  return absl::OkStatus();
}

void KvCache::Impl::MoveRows(int layer_idx, const KvLayerView& view, int kv_head,
                             std::span<const int> keep, int first_moved,
                             const KeyRewrite& rewrite) {
  Layer& layer = layers[layer_idx];
  const KvArenaView k_arena = view.KeyArena(kv_head), v_arena = view.ValueArena(kv_head);
  // The mutable bytes of one row: the view's const address, in this layer's arena.
  auto row_of = [&](const ArenaPtr& arena, const KvArenaView& arena_view, int logical) {
    return Layer::Mutable(arena, view.UnitOf(arena_view, logical, 0));
  };
  const Codec& k_codec = *k_arena.codec_impl;
  const bool rotated = options.config.hadamard_keys;
  // A joint (latent) unit holds the value too: it moves, and is re-encoded, with the key.
  const bool joint = layer.joint();
  const size_t k_bytes = k_arena.unit_bytes;
  std::vector<float> key(options.head_dim), value(options.head_dim);
  for (int i = first_moved; i < static_cast<int>(keep.size()); ++i) {
    std::byte* k_src = row_of(layer.k, k_arena, keep[i]);
    std::byte* k_dst = row_of(layer.k, k_arena, i);
    if (rewrite) {
      // H is orthonormal and symmetric, so applying it again undoes it: the callback sees the
      // key as the model wrote it, and the result is stored rotated like every other key.
      k_codec.DecodeHead(kv_head, {k_src, k_bytes}, key);
      if (joint) v_arena.codec_impl->DecodeHead(kv_head, {k_src, k_bytes}, value);
      if (rotated) HadamardRotate(key);
      rewrite(keep[i], i, key);
      if (rotated) HadamardRotate(key);
      if (joint) {
        k_codec.EncodeJointHead(kv_head, key, value, {k_dst, k_bytes});
      } else {
        k_codec.EncodeHead(kv_head, key, {k_dst, k_bytes});
      }
    } else {
      std::memcpy(k_dst, k_src, k_bytes);
    }
    if (!joint) {
      std::memcpy(row_of(layer.v, v_arena, i), row_of(layer.v, v_arena, keep[i]),
                  v_arena.unit_bytes);
    }
  }
}

void KvCache::Impl::RewriteThroughF32(Sequence& seq, int layer_idx, const KvLayerView& view,
                                      int kv_head, std::span<const int> keep, int first_written,
                                      int first_moved, const KeyRewrite& rewrite) {
  const Layer& layer = layers[layer_idx];
  SideBuffers& side = seq.layers[layer_idx];
  const size_t head_dim = static_cast<size_t>(options.head_dim);
  const int period = layer.period;
  const int num_kept = static_cast<int>(keep.size());
  // Where each kept token is now: the head's segments before the move.
  const KvLayerView head = view.HeadView(kv_head);
  const int old_encoded_end = EncodedEnd(layer, view.HeadTokens(kv_head));
  const int new_encoded_end = EncodedEnd(layer, num_kept);
  // A period of the new encoded range that takes one whole encoded period, unchanged, moves
  // as bytes: no decode, no re-rounding (a policy that drops whole units loses no precision).
  auto moves_whole = [&](int first) {
    if (first + period > new_encoded_end) return false;
    const int src = keep[first];
    return src % period == 0 && keep[first + period - 1] == src + period - 1 &&
           src + period <= old_encoded_end && !(rewrite && first + period > first_moved);
  };
  const KvArenaView k_arena = view.KeyArena(kv_head), v_arena = view.ValueArena(kv_head);
  auto period_bytes = [&](const ArenaPtr& arena, const KvArenaView& arena_view, int first) {
    return Layer::Mutable(arena, view.UnitOf(arena_view, first, 0));
  };
  auto pending_row = [&](std::vector<float>& buffer, int logical) {
    return buffer.data() +
           (static_cast<size_t>(kv_head) * PendingRows(layer) + logical % PendingRows(layer)) *
               head_dim;
  };
  // One head's arena's decoded unit, kept while consecutive sources fall in it (they ascend).
  struct DecodedUnit {
    const KvArenaView* arena;  // one-head
    std::vector<float> rows;
    int first = -1;
    const float* Row(const KvLayerView& v, int kv_head, int logical) {
      const int unit_first = logical - logical % arena->group_tokens;
      if (unit_first != first) {
        rows.resize(static_cast<size_t>(arena->group_tokens) * v.head_dim);
        arena->codec_impl->DecodeHead(kv_head, {v.UnitOf(*arena, unit_first, 0), arena->unit_bytes},
                                      rows);
        first = unit_first;
      }
      return rows.data() + static_cast<size_t>(logical - first) * v.head_dim;
    }
  };
  DecodedUnit k_unit{&k_arena, {}, -1}, v_unit{&v_arena, {}, -1};

  // Gather the kept tokens [first_written, num_kept) that do not move as whole periods, in F32
  // (keys rotated as stored), before anything is written.
  // The rows live in a buffer kept between calls: most of them are never touched (whole
  // periods move as bytes), and a fresh zeroed buffer of a long context per call cost more in
  // page faults than the moves themselves.
  const size_t row_floats = static_cast<size_t>(num_kept - first_written) * head_dim;
  thread_local std::vector<float> scratch;
  if (scratch.size() < 2 * row_floats) scratch.resize(2 * row_floats);
  const std::span<float> k_rows(scratch.data(), row_floats);
  const std::span<float> v_rows(scratch.data() + row_floats, row_floats);
  for (int i = first_written; i < num_kept; ++i) {
    if (moves_whole(i - i % period)) continue;
    const int src = keep[i];
    const float* k_src;
    const float* v_src;
    if (src < head.sinks.end) {
      k_src = head.sinks.KRow(src, 0, options.head_dim);
      v_src = head.sinks.VRow(src, 0, options.head_dim);
    } else if (src >= head.pending.begin) {
      k_src = pending_row(side.pending_k, src);
      v_src = pending_row(side.pending_v, src);
    } else {
      k_src = k_unit.Row(view, kv_head, src);
      v_src = v_unit.Row(view, kv_head, src);
    }
    const size_t dst = static_cast<size_t>(i - first_written) * head_dim;
    std::copy_n(k_src, head_dim, k_rows.begin() + dst);
    std::copy_n(v_src, head_dim, v_rows.begin() + dst);
    if (rewrite && i >= first_moved) {  // as in MoveRows: the callback sees the unrotated key
      const std::span<float> key = k_rows.subspan(dst, head_dim);
      if (options.config.hadamard_keys) HadamardRotate(key);
      rewrite(src, i, key);
      if (options.config.hadamard_keys) HadamardRotate(key);
    }
  }

  // Write them back, in ascending order (a period's source is never below it, so no source is
  // overwritten before it is read): whole periods below the new encoded end moved as bytes or
  // encoded again, the rest into the pending rows.
  const size_t period_floats = static_cast<size_t>(period) * head_dim;
  for (int first = first_written; first < new_encoded_end; first += period) {
    if (moves_whole(first)) {
      if (keep[first] == first) continue;
      const size_t k_bytes =
          static_cast<size_t>(period / k_arena.group_tokens) * k_arena.unit_bytes;
      std::memcpy(period_bytes(layer.k, k_arena, first),
                  period_bytes(layer.k, k_arena, keep[first]), k_bytes);
      if (!layer.joint()) {
        const size_t v_bytes =
            static_cast<size_t>(period / v_arena.group_tokens) * v_arena.unit_bytes;
        std::memcpy(period_bytes(layer.v, v_arena, first),
                    period_bytes(layer.v, v_arena, keep[first]), v_bytes);
      }
      continue;
    }
    const size_t offset = static_cast<size_t>(first - first_written) * head_dim;
    EncodePeriod(layer_idx, view, kv_head, first, k_rows.subspan(offset, period_floats),
                 v_rows.subspan(offset, period_floats));
  }
  for (int i = std::max(first_written, new_encoded_end); i < num_kept; ++i) {
    const size_t src = static_cast<size_t>(i - first_written) * head_dim;
    std::copy_n(k_rows.begin() + src, head_dim, pending_row(side.pending_k, i));
    std::copy_n(v_rows.begin() + src, head_dim, pending_row(side.pending_v, i));
  }
}

}  // namespace kvstack
