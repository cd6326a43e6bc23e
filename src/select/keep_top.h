// The one way every selection policy answers: protected tokens (sinks at the start, a recent
// window at the end) plus the highest-ranked of the tokens between. Position policies are the
// case with nothing between; score policies differ only in their ranking scores; SelectLayer's
// adaptive split ranks several heads' tokens together with the same machinery. Keeping the
// arithmetic here means budget, clamping and tie rules cannot drift apart between them.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "kvstack/policy.h"

namespace kvstack::select_internal {

// Sinks and a recent window for n tokens under `budget`, clamped so that they never overlap
// and never exceed the budget: the recent window shrinks first, then the sinks.
// sink_tokens, recent_tokens >= 0.
ProtectedTokens ClampProtected(int num_tokens, int budget, int sink_tokens, int recent_tokens);

// A score as it ranks: NaN below everything (a NaN would break the strict ordering the
// selection relies on, and a token without a usable score is the first to go).
inline float RankValue(float score) {
  return std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
}

// A total order of (score, logical index or position >= 0) as one integer: higher ranks give
// larger keys, and on equal ranks the later token does (the tie rule); NaN ranks as -inf and
// -0 as +0, as RankValue says. Integer keys without branches are what keep the selection
// cheap: it runs over every token of every kv head in the decode steps that evict.
inline uint64_t RankKey(float score, int index) {
  uint32_t bits = std::bit_cast<uint32_t>(score);
  bits = (bits & 0x7fffffffu) > 0x7f800000u ? 0xff800000u : bits;  // NaN -> -inf
  bits = bits == 0x80000000u ? 0u : bits;                          // -0 -> +0
  // IEEE floats order as sign-magnitude: flip negatives entirely, set the sign of the rest.
  bits ^= static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u;
  return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(index);
}

// Below this many keys to drop (or to keep), a bounded heap in one pass beats nth_element,
// whose constant is several passes; the steady state of decoding drops one token per step.
inline constexpr size_t kHeapSelectLimit = 256;

// Of `count` distinct keys, which `for_each_key(visit)` passes to visit(key) one by one, the
// largest of the count - wanted smallest: the keys kept are exactly those above it.
// 0 <= wanted < count. Key: totally ordered by operator<. Uses per-thread scratch.
template <typename Key, typename ForEachKey>
Key LargestDropped(size_t count, size_t wanted, ForEachKey for_each_key) {
  thread_local std::vector<Key> scratch;
  std::vector<Key>& heap = scratch;  // one TLS lookup, not one per access
  heap.clear();
  const size_t drop = count - wanted;
  // A heap of `size` keys ordered by `heap_less`, each key replacing its top when it belongs
  // further in; one instantiation per order, so the loop carries no branch on it.
  auto bounded_heap = [&](auto heap_less, size_t size) {
    for_each_key([&](const Key& key) {
      if (heap.size() < size) {
        heap.push_back(key);
        std::push_heap(heap.begin(), heap.end(), heap_less);
      } else if (heap_less(key, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), heap_less);
        heap.back() = key;
        std::push_heap(heap.begin(), heap.end(), heap_less);
      }
    });
    return heap.front();
  };
  // Few to drop: a max-heap of the `drop` smallest keys, whose top is the largest dropped.
  if (drop <= kHeapSelectLimit) return bounded_heap(std::less<Key>(), drop);
  // Few to keep: a min-heap of the wanted + 1 largest, whose smallest is the largest dropped.
  if (wanted < kHeapSelectLimit) return bounded_heap(std::greater<Key>(), wanted + 1);
  for_each_key([&](const Key& key) { heap.push_back(key); });
  std::nth_element(heap.begin(), heap.begin() + (drop - 1), heap.end());
  return heap[drop - 1];
}

// Writes into *keep, ascending: the protected tokens and the top (budget - protected.total())
// of the logical tokens [protected.sinks, n - protected.recent) by `ranking` ([n]; higher kept,
// equal values: the later token). `ranking` may be empty when nothing is left to rank.
// Requires num_tokens > budget >= protected.total().
void KeepProtectedAndTop(int num_tokens, int budget, ProtectedTokens protected_tokens,
                         std::span<const float> ranking, std::vector<int>* keep);

}  // namespace kvstack::select_internal
