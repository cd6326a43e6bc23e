// Attention kernel benchmarks, reported against the machine's read bandwidth measured at the
// start of the same run (1 GiB buffer, with 1 and with 2 threads). Decode is memory-bound:
// `bytes_per_second` is the cache it reads and `bw_fraction` that rate over the measured
// bandwidth at the same thread count. Prefill is compute-bound: `macs_per_second` counts the
// useful multiply-adds (q.k and p.v over the causal triangle).
//
// Shapes: A = the model benchmark (8 kv heads, 8 query heads, head_dim 64); B = a GQA model
// (8 kv heads, 32 query heads, head_dim 128). Arguments: tokens, threads.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kvstack/numeric.h"
#include "run/attention.h"
#include "run/memory_bandwidth.h"

namespace kvstack {
namespace {

constexpr int kBlockSize = 16;

// Read bandwidth by thread count, measured in main() before any benchmark runs.
std::map<int, double>& Bandwidth() {
  static std::map<int, double> bandwidth;
  return bandwidth;
}

ThreadPool* Pool(int num_threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  if (num_threads <= 1) return nullptr;
  auto& pool = pools[num_threads];
  if (!pool) pool = std::make_unique<ThreadPool>(num_threads);
  return pool.get();
}

// A paged view over random data, block_size 16, blocks in order. Owns its bytes.
struct BenchCache {
  std::vector<std::byte> k_arena, v_arena;
  std::vector<int32_t> block_table;
  KvLayerView view;

  BenchCache(int num_tokens, int num_kv_heads, int head_dim, CodecId codec) {
    const int num_blocks = (num_tokens + kBlockSize - 1) / kBlockSize;
    block_table.resize(num_blocks);
    for (int b = 0; b < num_blocks; ++b) block_table[b] = b;
    const size_t elem_bytes = codec == CodecId::kF32 ? 4 : 2;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto fill = [&](std::vector<std::byte>& arena, KvArenaView& arena_view) {
      arena_view.codec = codec;
      arena_view.unit_bytes = elem_bytes * head_dim;
      arena_view.head_stride = arena_view.unit_bytes * kBlockSize;
      arena_view.block_stride = arena_view.head_stride * num_kv_heads;
      arena.resize(arena_view.block_stride * num_blocks);
      for (size_t i = 0; i < arena.size(); i += elem_bytes) {
        const float x = dist(rng);
        if (codec == CodecId::kF32) {
          std::memcpy(&arena[i], &x, 4);
        } else {
          const uint16_t bits = codec == CodecId::kF16 ? F32ToF16(x) : F32ToBF16(x);
          std::memcpy(&arena[i], &bits, 2);
        }
      }
      arena_view.base = arena.data();
    };
    fill(k_arena, view.k);
    fill(v_arena, view.v);
    view.block_table = block_table;
    view.block_size = kBlockSize;
    view.num_tokens = num_tokens;
    view.num_kv_heads = num_kv_heads;
    view.head_dim = head_dim;
  }
};

void BM_Decode(benchmark::State& state, int num_kv_heads, int num_heads, int head_dim,
               CodecId codec) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  const BenchCache cache(num_tokens, num_kv_heads, head_dim, codec);
  std::vector<float> q(static_cast<size_t>(num_heads) * head_dim, 0.5f);
  std::vector<float> out(q.size());
  const AttentionParams params{num_heads, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  ThreadPool* pool = Pool(num_threads);
  for (auto _ : state) {
    Attention(cache.view, q.data(), 1, params, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = static_cast<double>(DecodeBytesRead(cache.view)) * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["bw_fraction"] =
      benchmark::Counter(bytes / Bandwidth()[num_threads], benchmark::Counter::kIsRate);
}

void BM_Prefill(benchmark::State& state, int num_kv_heads, int num_heads, int head_dim,
                CodecId codec) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  const BenchCache cache(num_tokens, num_kv_heads, head_dim, codec);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(num_tokens) * num_heads * head_dim);
  for (float& x : q) x = dist(rng);
  std::vector<float> out(q.size());
  const AttentionParams params{num_heads, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  ThreadPool* pool = Pool(num_threads);
  for (auto _ : state) {
    Attention(cache.view, q.data(), num_tokens, params, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  // Each (query, allowed key) pair costs head_dim MACs for q.k and head_dim for p.v per head.
  const double pairs = 0.5 * num_tokens * (num_tokens + 1.0);
  const double macs = pairs * num_heads * head_dim * 2.0 * state.iterations();
  state.counters["macs_per_second"] = benchmark::Counter(macs, benchmark::Counter::kIsRate);
  state.counters["tokens_per_second"] = benchmark::Counter(
      static_cast<double>(num_tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

void RegisterAll() {
  const struct {
    const char* name;
    CodecId codec;
  } codecs[] = {{"f16", CodecId::kF16}, {"bf16", CodecId::kBF16}, {"f32", CodecId::kF32}};
  for (const auto& c : codecs) {
    auto* a = benchmark::RegisterBenchmark((std::string("DecodeA/") + c.name).c_str(), BM_Decode, 8,
                                           8, 64, c.codec);
    for (int tokens : {1024, 4096, 16384}) {
      for (int threads : {1, 2}) a->Args({tokens, threads});
    }
    a->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  for (const auto& c : codecs) {
    auto* b = benchmark::RegisterBenchmark((std::string("DecodeB/") + c.name).c_str(), BM_Decode, 8,
                                           32, 128, c.codec);
    for (int tokens : {1024, 4096, 16384, 65536}) b->Args({tokens, 2});
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("PrefillA/f16", BM_Prefill, 8, 8, 64, CodecId::kF16)
      ->Args({4096, 1})
      ->Args({4096, 2})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace kvstack

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  constexpr size_t kBandwidthBytes = size_t{1} << 30;
  for (int threads : {1, 2}) {
    const double bw = kvstack::MeasureReadBandwidth(kBandwidthBytes, 5, kvstack::Pool(threads));
    kvstack::Bandwidth()[threads] = bw;
    std::printf("read bandwidth, %d thread(s): %.1f GB/s\n", threads, bw / 1e9);
  }
  kvstack::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
