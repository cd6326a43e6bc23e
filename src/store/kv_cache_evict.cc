// KvCache::RetainTokens: the cache's side of eviction. Layer 1 (src/select) decides which
// tokens one (layer, kv head) keeps; here the kept rows move forward, in logical order, to
// logical [0, kept), in whatever layout the cache has (the slot of a logical token is the one
// kv_view.h defines, so contiguous, paged and ring move alike). Since `keep` is ascending, a
// row's source is never a row an earlier move wrote, so the moves are safe in place.
//
// Only one-token units can leave one at a time, so CheckCanEvict refuses codecs that group
// tokens and KIVI's recent window; with those refused there is never a pending segment, and
// sinks (logical [0, S), always kept) never move, so their F32 copies stay valid. Moves change
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

absl::Status KvCache::CheckCanEvict() const {
  for (int layer_idx = 0; layer_idx < num_layers(); ++layer_idx) {
    const Impl::Layer& layer = impl_->layers[layer_idx];
    for (const Codec* codec : {layer.k_codec.get(), layer.v_codec.get()}) {
      if (codec->group_tokens() == 1) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "kv cache: cannot evict tokens: codec '", std::string(codec->name()), "' (layer ",
          layer_idx, " ", codec == layer.k_codec.get() ? "keys" : "values", ") encodes ",
          codec->group_tokens(),
          " tokens per unit, which cannot leave one at a time; allowed: codecs with one-token "
          "units"));
    }
  }
  if (impl_->recent_tokens() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv cache: cannot evict tokens with recent_tokens ", impl_->recent_tokens(),
        ": the recent window holds the newest tokens in F32 until whole units fill, so they "
        "cannot leave one at a time; allowed: recent_tokens 0"));
  }
  return absl::OkStatus();
}

absl::Status KvCache::RetainTokens(SeqId seq_id, int layer_idx, int kv_head,
                                   std::span<const int> keep, const KeyRewrite& rewrite) {
  KVS_RETURN_IF_ERROR(CheckCanEvict());
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
  // Paged: blocks above the new maximum are freed; the rows from first_moved on change, and
  // the next appends of this head write right above its new count, so every remaining block
  // from the one holding first_moved must be this sequence's own (copy-on-write).
  const size_t blocks_kept =
      impl_->paged()
          ? static_cast<size_t>((new_num_tokens + impl_->block_size - 1) / impl_->block_size)
          : seq.block_table.size();
  const size_t first_written = std::min(
      blocks_kept, static_cast<size_t>(first_moved) / static_cast<size_t>(impl_->block_size));
  const int num_copies = impl_->NumShared(seq, first_written, blocks_kept);
  if (num_copies > impl_->pool.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache: cannot evict in sequence ", seq_id, ": ", num_copies,
        " shared blocks must be copied first and only ", impl_->pool.num_free(), " are free"));
  }

  impl_->Unshare(seq, first_written, blocks_kept);
  Impl::Layer& layer = impl_->layers[layer_idx];
  const KvLayerView view = View(seq_id, layer_idx);  // after the copies: their block ids
  // The mutable bytes of one row: the view's const address, offset into this layer's arena.
  auto row_of = [&](const ArenaPtr& arena, const KvArenaView& arena_view, int logical) {
    std::byte* row = nullptr;
    view.ForEachRun(logical, logical + 1, [&](int, int, int32_t block_id, int row_idx) {
      row = arena.get() + (arena_view.Row(block_id, row_idx, kv_head) - arena_view.base);
    });
    return row;
  };
  const Codec& k_codec = *layer.k_codec;
  const bool rotated = impl_->options.config.hadamard_keys;
  // A joint (latent) unit holds the value too: it moves, and is re-encoded, with the key.
  const bool joint = layer.joint();
  std::vector<float> key(impl_->options.head_dim), value(impl_->options.head_dim);
  for (int i = first_moved; i < num_kept; ++i) {
    std::byte* k_src = row_of(layer.k, view.k, keep[i]);
    std::byte* k_dst = row_of(layer.k, view.k, i);
    if (rewrite) {
      // H is orthonormal and symmetric, so applying it again undoes it: the callback sees the
      // key as the model wrote it, and the result is stored rotated like every other key.
      k_codec.DecodeHead(kv_head, {k_src, view.k.unit_bytes}, key);
      if (joint) layer.v_codec->DecodeHead(kv_head, {k_src, view.k.unit_bytes}, value);
      if (rotated) HadamardRotate(key);
      rewrite(keep[i], i, key);
      if (rotated) HadamardRotate(key);
      if (joint) {
        k_codec.EncodeJointHead(kv_head, key, value, {k_dst, view.k.unit_bytes});
      } else {
        k_codec.EncodeHead(kv_head, key, {k_dst, view.k.unit_bytes});
      }
    } else {
      std::memcpy(k_dst, k_src, view.k.unit_bytes);
    }
    if (!joint) {
      std::memcpy(row_of(layer.v, view.v, i), row_of(layer.v, view.v, keep[i]), view.v.unit_bytes);
    }
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

}  // namespace kvstack
