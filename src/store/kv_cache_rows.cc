// KvCache::Write and KvCache::View: where a token's rows go and how the view describes them.
// A written token lands in up to three places of its (sequence, layer): the F32 sink buffer
// if it is one of the first sink_tokens tokens, the arena (encoded), and for codecs whose
// units hold several tokens the F32 pending buffer, from which the whole unit is encoded once
// it leaves the recent window. View() tells readers which logical range each segment holds.
// After an eviction a head may hold fewer tokens than the sequence: its new tokens are still
// its newest, so it stores them lower down, in the arena and in the pending buffer alike (see
// KvCache::RetainTokens).
#include <algorithm>
#include <span>
#include <vector>

#include "kvstack/kv_cache.h"
#include "represent/hadamard.h"
#include "store/kv_cache_impl.h"

namespace kvstack {

void KvCache::Write(SeqId seq_id, int layer_idx, int logical_begin, std::span<const float> k,
                    std::span<const float> v) {
  const KvLayerView view = View(seq_id, layer_idx);
  const size_t head_dim = view.head_dim;
  const size_t token_floats = static_cast<size_t>(view.num_kv_heads) * head_dim;
  KVS_CHECK(k.size() == v.size() && k.size() % token_floats == 0);
  const int num_tokens = static_cast<int>(k.size() / token_floats);
  KVS_CHECK(logical_begin >= 0 && logical_begin + num_tokens <= view.num_tokens);

  // Only this layer's buffers of the sequence are touched, so writes of different layers may
  // run concurrently. The view is the read side; its const bases and this layer's mutable
  // arenas are the same bytes, so offsets computed through the view address the arenas.
  Impl::Sequence& seq = impl_->MutableSeq(seq_id);
  Impl::SideBuffers& side = seq.layers[layer_idx];
  Impl::Layer& layer = impl_->layers[layer_idx];
  const int sink_tokens = impl_->sink_tokens();
  const bool rotate = impl_->options.config.hadamard_keys;
  // Absolute position of logical token 0 (non-zero in a wrapped ring, and after an eviction
  // shortened every head): tells which of the tokens written are sinks.
  const int64_t position_offset = seq.num_appended - seq.num_tokens;
  std::vector<float> rotated(rotate ? head_dim : 0);
  const int pending_rows = impl_->PendingRows(layer);
  // A head that kept fewer tokens after an eviction lags NumTokens' numbering by its shift:
  // the new tokens are its newest.
  auto shift_of = [&](int h) { return view.num_tokens - view.HeadTokens(h); };

  // Called after head h's token that makes it hold `num_written` tokens: when that moves the
  // end of its encoded range, the one period that left the recent window is encoded from the
  // pending buffer into the arena. The pending buffer's rows are a multiple of the period, so
  // a period's rows are consecutive there.
  auto EncodeSettledPeriod = [&](int h, int num_written) {
    const int settled = num_written - impl_->recent_tokens();
    if (settled <= 0 || settled % layer.period != 0) return;
    const int first = settled - layer.period;
    const size_t offset = (static_cast<size_t>(h) * pending_rows + first % pending_rows) * head_dim;
    const size_t period_floats = static_cast<size_t>(layer.period) * head_dim;
    impl_->EncodePeriod(layer_idx, view, h, first,
                        std::span(side.pending_k).subspan(offset, period_floats),
                        std::span(side.pending_v).subspan(offset, period_floats));
  };

  // Token t's key row for head h, rotated when the config asks for it.
  auto key_row = [&](int t, int h) -> std::span<const float> {
    const std::span<const float> row =
        k.subspan(static_cast<size_t>(t) * token_floats + h * head_dim, head_dim);
    if (!rotate) return row;
    std::copy(row.begin(), row.end(), rotated.begin());
    HadamardRotate(rotated);
    return rotated;
  };
  auto value_row = [&](int t, int h) {
    return v.subspan(static_cast<size_t>(t) * token_floats + h * head_dim, head_dim);
  };

  // The F32 side buffers, token by token: sink copies (by absolute position), and the pending
  // buffer, from which a period is encoded once it leaves the recent window.
  for (int t = 0; t < num_tokens; ++t) {
    const int logical = logical_begin + t;
    const int64_t pos = position_offset + logical;
    if (pos >= sink_tokens && pending_rows == 0) break;  // positions only grow
    for (int h = 0; h < view.num_kv_heads; ++h) {
      const std::span<const float> k_row = key_row(t, h);
      const std::span<const float> v_row = value_row(t, h);
      if (pos < sink_tokens) {
        const size_t dst = (static_cast<size_t>(h) * sink_tokens + pos) * head_dim;
        std::copy(k_row.begin(), k_row.end(), side.sink_k.begin() + dst);
        std::copy(v_row.begin(), v_row.end(), side.sink_v.begin() + dst);
      }
      if (pending_rows > 0) {
        // The pending buffer (circular, row = head logical % pending_rows) is also the gather
        // buffer: a unit needs one head's tokens contiguous, the input interleaves heads.
        const int head_logical = logical - shift_of(h);
        const size_t dst =
            (static_cast<size_t>(h) * pending_rows + head_logical % pending_rows) * head_dim;
        std::copy(k_row.begin(), k_row.end(), side.pending_k.begin() + dst);
        std::copy(v_row.begin(), v_row.end(), side.pending_v.begin() + dst);
      }
    }
    if (pending_rows > 0) {
      for (int h = 0; h < view.num_kv_heads; ++h) EncodeSettledPeriod(h, logical + 1 - shift_of(h));
    }
  }
  if (pending_rows > 0) return;

  // Encoded as they arrive, straight from the input, head by head: a head that kept fewer
  // tokens after an eviction lags NumTokens' numbering by `shift` (the new tokens are its
  // newest). Tokens below the shift are ones that head no longer holds (a ring that wrapped
  // past them); they are not stored for it.
  for (int h = 0; h < view.num_kv_heads; ++h) {
    const int shift = shift_of(h);
    const int begin = std::max(logical_begin, shift);
    const int end = logical_begin + num_tokens;
    if (begin >= end) continue;
    const KvArenaView k_arena = view.KeyArena(h), v_arena = view.ValueArena(h);
    view.ForEachRun(
        begin - shift, end - shift, [&](int run_begin, int count, int32_t block_id, int row_begin) {
          // Shared (forked) blocks lie below every head's count and are never
          // rewritten; writing one would change the other sequence's history.
          KVS_DCHECK(impl_->pool.ref_count(block_id) == 1);
          for (int c = 0; c < count; ++c) {
            const int t = run_begin + c + shift - logical_begin;
            const int row = row_begin + c;
            layer.EncodeHead(
                h, key_row(t, h), value_row(t, h),
                {Impl::Layer::Mutable(layer.k, k_arena.Row(block_id, row, 0)), k_arena.unit_bytes},
                {Impl::Layer::Mutable(layer.v_arena(), v_arena.Row(block_id, row, 0)),
                 v_arena.unit_bytes});
          }
        });
  }
}

KvLayerView KvCache::View(SeqId seq_id, int layer_idx) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers());
  const Impl::Sequence& seq = impl_->Seq(seq_id);
  const Impl::Layer& layer = impl_->layers[layer_idx];
  const Impl::SideBuffers& side = seq.layers[layer_idx];
  const int sink_tokens = impl_->sink_tokens();
  const int sinks_end = std::min(sink_tokens, seq.num_tokens);
  const int encoded_end = impl_->EncodedEnd(layer, seq.num_tokens);
  return KvLayerView{
      .k = layer.k_heads[0],
      .v = layer.v_heads[0],
      .block_table = seq.block_table,
      .block_size = impl_->block_size,
      .first_slot = seq.first_slot,
      .num_tokens = seq.num_tokens,
      .num_kv_heads = impl_->options.num_kv_heads,
      .head_dim = impl_->options.head_dim,
      .sinks = {.k = side.sink_k.empty() ? nullptr : side.sink_k.data(),
                .v = side.sink_v.empty() ? nullptr : side.sink_v.data(),
                .stride_tokens = sink_tokens,
                .origin = 0,
                .begin = 0,
                .end = sinks_end},
      // Sinks win where the two overlap: a sink is never also pending.
      .pending = {.k = side.pending_k.empty() ? nullptr : side.pending_k.data(),
                  .v = side.pending_v.empty() ? nullptr : side.pending_v.data(),
                  .stride_tokens = std::max(1, impl_->PendingRows(layer)),
                  .origin = 0,
                  .begin = std::max(encoded_end, sinks_end),
                  .end = seq.num_tokens},
      .keys_rotated = impl_->options.config.hadamard_keys,
      .head_tokens = impl_->HeadTokensOf(seq, layer_idx),
      .pending_period = layer.period,
      .pending_recent = impl_->recent_tokens(),
      .head_k = layer.mixed ? std::span<const KvArenaView>(layer.k_heads)
                            : std::span<const KvArenaView>(),
      .head_v = layer.mixed ? std::span<const KvArenaView>(layer.v_heads)
                            : std::span<const KvArenaView>(),
  };
}

void KvCache::Impl::EncodePeriod(int layer_idx, const KvLayerView& view, int kv_head, int first,
                                 std::span<float> k_rows, std::span<float> v_rows) {
  Layer& layer = layers[layer_idx];
  const int period = layer.period;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  KVS_DCHECK(first % period == 0);
  KVS_DCHECK(k_rows.size() == period * head_dim && v_rows.size() == period * head_dim);
  const int num_sink_rows = std::clamp(sink_tokens() - first, 0, period - 1);
  for (int r = 0; r < num_sink_rows; ++r) {
    std::copy_n(k_rows.end() - head_dim, head_dim, k_rows.begin() + r * head_dim);
    std::copy_n(v_rows.end() - head_dim, head_dim, v_rows.begin() + r * head_dim);
  }
  // A period never straddles blocks (block_size is a multiple of it), so its units are
  // consecutive from the one holding its first token.
  const KvArenaView k_arena = view.KeyArena(kv_head), v_arena = view.ValueArena(kv_head);
  std::byte* k_dst = Layer::Mutable(layer.k, view.UnitOf(k_arena, first, 0));
  std::byte* v_dst = Layer::Mutable(layer.v_arena(), view.UnitOf(v_arena, first, 0));
  layer.EncodeHead(
      kv_head, k_rows, v_rows,
      {k_dst, static_cast<size_t>(period / k_arena.group_tokens) * k_arena.unit_bytes},
      {v_dst, static_cast<size_t>(period / v_arena.group_tokens) * v_arena.unit_bytes});
}

}  // namespace kvstack
