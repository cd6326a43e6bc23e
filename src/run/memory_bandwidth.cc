// MeasureReadBandwidth: a Highway-vectorised sum over a large buffer, per target with runtime
// dispatch like the kernels it is the yardstick for, so both read memory the same way.

#include "run/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "base/large_buffer.h"
#include "kvstack/check.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/memory_bandwidth.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Sum of data[0, n). Four independent accumulators keep several loads in flight.
float SumFloats(const float* HWY_RESTRICT data, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::Add(a0, hn::LoadU(d, data + i));
    a1 = hn::Add(a1, hn::LoadU(d, data + i + lanes));
    a2 = hn::Add(a2, hn::LoadU(d, data + i + 2 * lanes));
    a3 = hn::Add(a3, hn::LoadU(d, data + i + 3 * lanes));
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) sum += data[i];
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(SumFloats);

namespace {

// Keeps `total` (a sum of what was read) observable, so that the loads cannot be dropped.
void Observe(float total) {
  static std::atomic<float> sink;
  sink.store(total, std::memory_order_relaxed);
}

}  // namespace

double MeasureReadBandwidth(size_t bytes, int repetitions, ThreadPool* pool) {
  KVS_CHECK(bytes >= 64 && repetitions >= 1);
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const size_t n = bytes / sizeof(float);
  // Not value-initialised: the first write below is the per-thread one.
  // As the KV cache arenas are allocated (huge pages where the kernel gives them), so that the
  // probe and the kernels it is compared with pay the same for their pages.
  const std::unique_ptr<float[], LargeBufferFree> data(
      static_cast<float*>(AllocateLargeBuffer(n * sizeof(float), 64)));
  KVS_CHECK(data != nullptr);
  // Each thread writes its own range first, so the pages are faulted in (and, on NUMA
  // machines, placed) before the timed passes.
  const size_t per_thread = (n + num_threads - 1) / num_threads;
  std::vector<float> partial_sums(num_threads, 0.0f);
  auto for_each_range = [&](auto&& fn) {
    auto task = [&](int64_t task_idx, int /*thread_idx*/) {
      const size_t begin = std::min(n, static_cast<size_t>(task_idx) * per_thread);
      const size_t end = std::min(n, begin + per_thread);
      fn(static_cast<int>(task_idx), begin, end);
    };
    if (pool == nullptr) {
      task(0, 0);
    } else {
      pool->Run(num_threads, task);
    }
  };
  for_each_range([&](int, size_t begin, size_t end) {
    std::fill(data.get() + begin, data.get() + end, 1.0f);
  });

  double best_seconds = 0.0;
  float total = 0.0f;
  for (int rep = 0; rep < repetitions; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for_each_range([&](int range_idx, size_t begin, size_t end) {
      partial_sums[range_idx] = HWY_DYNAMIC_DISPATCH(SumFloats)(data.get() + begin, end - begin);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep == 0 || seconds < best_seconds) best_seconds = seconds;
    for (float s : partial_sums) total += s;
  }
  Observe(total);
  return static_cast<double>(n * sizeof(float)) / std::max(best_seconds, 1e-9);
}

double MeasureDecodeReadRate(const KvLayerView& view, int repetitions, ThreadPool* pool) {
  KVS_CHECK(repetitions >= 1 && view.head_tokens.empty() && !view.mixed_codecs());
  constexpr int kTile = 256;  // tokens: the decode kernel's tile (attention_readers-inl.h)
  const int begin = view.arena_begin(), end = view.arena_end();
  const bool joint = view.v.codec_impl != nullptr && view.v.codec_impl->joint();
  // Sums the units of `arena` that hold the tokens [t0, t1) of `kv_head`; counts their bytes.
  auto sum_units = [&](const KvArenaView& arena, int kv_head, int t0, int t1, size_t* bytes) {
    const int group_tokens = std::max(1, arena.group_tokens);
    float sum = 0.0f;
    view.ForEachRun(t0, t1, [&](int, int count, int32_t block_id, int row) {
      const int first = row / group_tokens, last = (row + count - 1) / group_tokens;
      const std::byte* units = arena.Unit(block_id, first, kv_head);
      const size_t run_bytes = static_cast<size_t>(last - first + 1) * arena.unit_bytes;
      sum += HWY_DYNAMIC_DISPATCH(SumFloats)(reinterpret_cast<const float*>(units),
                                             run_bytes / sizeof(float));
      *bytes += run_bytes;
    });
    return sum;
  };
  std::vector<float> partial_sums(view.num_kv_heads, 0.0f);
  std::vector<size_t> head_bytes(view.num_kv_heads, 0);
  auto task = [&](int64_t kv_head, int /*thread_idx*/) {
    const int h = static_cast<int>(kv_head);
    float sum = 0.0f;
    size_t bytes = 0;
    for (int t0 = begin; t0 < end; t0 += kTile) {
      const int t1 = std::min(end, t0 + kTile);
      sum += sum_units(view.k, h, t0, t1, &bytes);
      if (!joint) sum += sum_units(view.v, h, t0, t1, &bytes);
    }
    partial_sums[h] = sum;
    head_bytes[h] = bytes;
  };
  double best_seconds = 0.0;
  float total = 0.0f;
  for (int rep = 0; rep < repetitions; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    if (pool == nullptr) {
      for (int h = 0; h < view.num_kv_heads; ++h) task(h, 0);
    } else {
      pool->Run(view.num_kv_heads, task);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep == 0 || seconds < best_seconds) best_seconds = seconds;
    for (float s : partial_sums) total += s;
  }
  Observe(total);
  size_t bytes = 0;
  for (size_t b : head_bytes) bytes += b;
  return static_cast<double>(bytes) / std::max(best_seconds, 1e-9);
}

size_t DecodeBytesRead(const KvLayerView& view) {
  // After an eviction heads hold different numbers of tokens, and heads may use different
  // codecs: each is then read as its own view (uniform, so this recursion is one level deep).
  if (!view.uniform_heads()) {
    size_t bytes = 0;
    for (int h = 0; h < view.num_kv_heads; ++h) bytes += DecodeBytesRead(view.HeadView(h));
    return bytes;
  }
  // Whole units are read, so an arena range that starts or ends mid-unit (after the sinks)
  // costs the full units it touches. Unit boundaries sit on logical multiples of group_tokens
  // (multi-token codecs never use a wrapped ring).
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  auto arena_bytes = [&](const KvArenaView& arena) -> size_t {
    if (arena_begin >= arena_end) return 0;
    const int group_tokens = std::max(1, arena.group_tokens);
    const size_t num_units = static_cast<size_t>((arena_end + group_tokens - 1) / group_tokens -
                                                 arena_begin / group_tokens);
    return num_units * arena.unit_bytes;
  };
  const size_t segment_tokens =
      static_cast<size_t>(view.sinks.num_tokens()) + view.pending.num_tokens();
  const size_t segment_bytes = segment_tokens * 2 * view.head_dim * sizeof(float);
  // A joint (latent) layer's values are decoded from the key units: no bytes of their own.
  const bool joint = view.v.codec_impl != nullptr && view.v.codec_impl->joint();
  return view.num_kv_heads *
         (arena_bytes(view.k) + (joint ? 0 : arena_bytes(view.v)) + segment_bytes);
}

}  // namespace kvstack
#endif  // HWY_ONCE
