// Decode attention in the low-rank form against F16, on shape B of attention_bench (8 kv heads
// × head_dim 128, 32 query heads, GQA 4), one sequence, 2 threads: keys and values at rank 64
// and 32 (F16 coordinates) and at rank 32 with 4-bit coordinates, and latent at rank 64 (one
// set of 64 coordinates per token for key and value together: the bytes of lowrank-r32 on both
// sides). Arguments: tokens, threads; 32k tokens with --long_contexts. Each cache is a
// one-layer paged KvCache (block_size 16) grown with random tokens through its own append path
// (GrowBenchCache); the bases come from a profile of random correlated rows, computed once (a
// few seconds: the joint PCA has 256 dimensions) and saved to a temporary file for the caches.
// At the end a table gives per context and codec the time per decode step (best of
// --benchmark_repetitions), the cache bytes read per second over the read bandwidth measured
// in the same run, and the speed-up over f16.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_cache.h"
#include "bench_pool.h"
#include "benchmark/benchmark.h"
#include "kvstack/kv_profile.h"
#include "run/attention.h"
#include "run/memory_bandwidth.h"

namespace kvstack {
namespace {

constexpr int kThreads = 2;
const char* const kCodecs[] = {"f16", "lowrank-r64", "lowrank-r32", "lowrank-r32-int4",
                               "latent-r64"};

double& Bandwidth() {
  static double bandwidth = 0.0;
  return bandwidth;
}

// Rows [num_tokens, kShapeB.num_kv_heads, kShapeB.head_dim] with decaying variances mixed across
// channels.
std::vector<float> Rows(int num_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> rows(static_cast<size_t>(num_tokens) * kShapeB.num_kv_heads *
                          kShapeB.head_dim);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int c = static_cast<int>(i % kShapeB.head_dim);
    rows[i] = normal(rng) * 4.0f / (1.0f + 0.1f * c);
  }
  for (size_t i = 1; i < rows.size(); ++i) rows[i] += 0.5f * rows[i - 1];  // correlate
  return rows;
}

// The model hash the bench's profile is saved under (any value: the caches load it with the same).
constexpr uint64_t kProfileHash = 1;

const KvProfile& Profile() {
  static const KvProfile profile = [] {
    std::mt19937 rng(1);
    KvProfile p(kProfileHash, 1, kShapeB.num_kv_heads, kShapeB.head_dim);
    p.Accumulate(0, Rows(1024, rng), Rows(1024, rng));
    KVS_CHECK(p.Finalize().ok());
    return p;
  }();
  return profile;
}

// The profile as a file, as KvCache loads it; removed at the end of main.
const std::string& ProfilePath() {
  static const std::string path = [] {
    const std::string p = (std::filesystem::temp_directory_path() /
                           ("kvstack_lowrank_bench_" + std::to_string(getpid()) + ".kvsprof"))
                              .string();
    KVS_CHECK(Profile().Save(p).ok());
    return p;
  }();
  return path;
}

// One sequence of random tokens in a one-layer paged KvCache encoded with `codec`
// (GrowBenchCache), and its view. A latent layer's value view reads the key arena.
struct BenchCache {
  std::unique_ptr<KvCache> cache;
  KvLayerView view;

  BenchCache(int num_tokens, const std::string& codec) {
    std::vector<SeqId> ids;
    // Appended 4096 tokens at a time: the random rows stay small.
    cache = GrowBenchCache(kShapeB, codec, num_tokens, 4096, 1, &ids, ProfilePath(), kProfileHash);
    view = cache->View(ids[0], 0);
  }

  // Cache bytes one decode step reads: every key unit, and every value unit unless the values
  // read the key units (latent).
  double BytesPerStep() const {
    const size_t per_token =
        view.k.unit_bytes + (view.v.base == view.k.base ? 0 : view.v.unit_bytes);
    return static_cast<double>(per_token) * view.num_tokens * kShapeB.num_kv_heads;
  }
};

std::map<std::pair<std::string, int>, double>& DecodeTimes() {
  static std::map<std::pair<std::string, int>, double> times;
  return times;
}

void BM_Decode(benchmark::State& state, std::string codec) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  const BenchCache cache(num_tokens, codec);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(kShapeBQueryHeads) * kShapeB.head_dim);
  for (float& x : q) x = 0.1f * normal(rng);
  std::vector<float> out(q.size());
  const AttentionParams params{kShapeBQueryHeads,
                               1.0f / std::sqrt(static_cast<float>(kShapeB.head_dim))};
  ThreadPool* pool = BenchPool(num_threads);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    Attention(cache.view, q.data(), 1, params, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  if (num_threads == kThreads) {
    double& best = DecodeTimes()[{codec, num_tokens}];
    best = best == 0.0 ? seconds : std::min(best, seconds);
  }
  const double bytes = cache.BytesPerStep() * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["bw_fraction"] =
      benchmark::Counter(bytes / Bandwidth(), benchmark::Counter::kIsRate);
  // Nanoseconds per key and kv head on one thread's time.
  state.counters["ns_per_token_head"] = benchmark::Counter(
      static_cast<double>(num_tokens) * kShapeB.num_kv_heads / num_threads * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void RegisterAll(bool long_contexts) {
  for (const char* codec : kCodecs) {
    auto* b = benchmark::RegisterBenchmark((std::string("LowRankDecodeB/") + codec).c_str(),
                                           BM_Decode, std::string(codec));
    for (int tokens : {1024, 4096, 16384}) b->Args({tokens, kThreads});
    if (long_contexts) b->Args({32768, kThreads});
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
    // One thread over a cache that stays in L2 (1024 tokens: 1 MiB in f16), in CPU time: the
    // arithmetic per key, which a loaded machine disturbs less.
    benchmark::RegisterBenchmark((std::string("LowRankComputeB/") + codec).c_str(), BM_Decode,
                                 std::string(codec))
        ->Args({1024, 1})
        ->Args({16384, 1})
        ->Unit(benchmark::kMicrosecond);
  }
}

void PrintTable() {
  if (DecodeTimes().empty()) return;
  std::printf(
      "\nDecode, 8 kv heads x head_dim 128, 32 query heads, %d threads (bandwidth %.1f GB/s):\n",
      kThreads, Bandwidth() / 1e9);
  std::printf("%8s %-17s %9s %10s %10s %8s %9s %8s\n", "tokens", "codec", "bits/el", "us/step",
              "MB/step", "GB/s", "fraction", "vs f16");
  for (int tokens : {1024, 4096, 16384, 32768}) {
    const auto f16 = DecodeTimes().find({"f16", tokens});
    for (const char* codec : kCodecs) {
      const auto it = DecodeTimes().find({codec, tokens});
      if (it == DecodeTimes().end()) continue;
      const BenchCache cache(kShapeB.block_size, codec);  // for its unit sizes only
      const double bytes = cache.BytesPerStep() / kShapeB.block_size * tokens;
      const double bits = 8.0 * bytes / (2.0 * tokens * kShapeB.num_kv_heads * kShapeB.head_dim);
      std::printf("%8d %-17s %9.2f %10.1f %10.2f %8.2f %9.2f %8.2f\n", tokens, codec, bits,
                  it->second * 1e6, bytes / 1e6, bytes / it->second / 1e9,
                  bytes / it->second / Bandwidth(),
                  f16 != DecodeTimes().end() ? f16->second / it->second : 0.0);
    }
  }
}

}  // namespace
}  // namespace kvstack

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  bool long_contexts = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--long_contexts") long_contexts = true;
  }
  kvstack::Bandwidth() =
      kvstack::MeasureReadBandwidth(size_t{1} << 30, 5, kvstack::BenchPool(kvstack::kThreads));
  std::printf("read bandwidth, %d threads: %.1f GB/s\n", kvstack::kThreads,
              kvstack::Bandwidth() / 1e9);
  kvstack::ProfilePath();  // the bases, before any timing
  kvstack::RegisterAll(long_contexts);
  benchmark::RunSpecifiedBenchmarks();
  kvstack::PrintTable();
  std::filesystem::remove(kvstack::ProfilePath());
  benchmark::Shutdown();
  return 0;
}
