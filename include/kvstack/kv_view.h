// KvLayerView: the non-owning read view of one sequence's keys and values in one layer, in
// their stored (encoded) format. Contiguous, paged and ring layouts all produce this one view;
// every attention kernel reads through it. Plain data, passed by value; valid until the cache
// that produced it is next modified.
//
// Addressing. Logical token i (0 <= i < num_tokens, oldest first) lives in slot
//   s = (first_slot + i) % (block_table.size() * block_size)
// of the sequence, i.e. in physical block block_table[s / block_size], row s % block_size.
// Inside an arena, block b's rows for kv head h start at
//   base + b * block_stride + h * head_stride, one row every row_bytes.
// Contiguous: one block of `capacity` slots, first_slot 0. Paged: many blocks, first_slot 0.
// Ring: one block of `capacity` slots; first_slot moves once the ring has wrapped.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvstack/check.h"
#include "kvstack/codec.h"

namespace kvstack {

// One arena (keys or values) of one layer.
struct KvArenaView {
  const std::byte* base = nullptr;  // [num_blocks_in_pool][num_kv_heads][block_size][row_bytes]
  size_t block_stride = 0;          // bytes between consecutive physical blocks
  size_t head_stride = 0;           // bytes between kv heads inside a block
  size_t row_bytes = 0;             // bytes per token per head
  CodecId codec = CodecId::kF32;

  const std::byte* Row(int32_t block_id, int row, int kv_head) const {
    return base + static_cast<size_t>(block_id) * block_stride +
           static_cast<size_t>(kv_head) * head_stride + static_cast<size_t>(row) * row_bytes;
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

  int num_slots() const { return static_cast<int>(block_table.size()) * block_size; }

  // Calls fn(logical_begin, count, block_id, row_begin) for maximal runs of logical tokens
  // [begin, end) that sit in consecutive rows of one block, in logical order.
  template <typename Fn>
  void ForEachRun(int begin, int end, Fn&& fn) const {
    KVS_DCHECK(0 <= begin && begin <= end && end <= num_tokens);
    const int slots = num_slots();
    int i = begin;
    while (i < end) {
      int slot = first_slot + i;
      if (slot >= slots) slot -= slots;
      const int row = slot % block_size;
      const int count = std::min(end - i, block_size - row);
      fn(i, count, block_table[slot / block_size], row);
      i += count;
    }
  }
};

}  // namespace kvstack
