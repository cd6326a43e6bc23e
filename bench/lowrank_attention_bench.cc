// Decode attention in the low-rank form against F16, on shape B of attention_bench (8 kv heads
// × head_dim 128, 32 query heads, GQA 4), one sequence, 2 threads: keys and values at rank 64
// and 32 (F16 coordinates) and at rank 32 with 4-bit coordinates, and latent at rank 64 (one
// set of 64 coordinates per token for key and value together: the bytes of lowrank-r32 on both
// sides). Arguments: tokens, threads; 32k tokens with --long_contexts. The views are paged
// (block_size 16) over random data encoded with each codec; the bases come from a profile of
// random correlated rows, computed once (a few seconds: the joint PCA has 256 dimensions).
// At the end a table gives per context and codec the time per decode step (best of
// --benchmark_repetitions), the cache bytes read per second over the read bandwidth measured
// in the same run, and the speed-up over f16.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_pool.h"
#include "benchmark/benchmark.h"
#include "kvstack/codec.h"
#include "kvstack/kv_profile.h"
#include "represent/lowrank_codec.h"
#include "run/attention.h"
#include "run/memory_bandwidth.h"

namespace kvstack {
namespace {

constexpr int kNumKvHeads = 8;
constexpr int kNumHeads = 32;
constexpr int kHeadDim = 128;
constexpr int kBlockSize = 16;
constexpr int kThreads = 2;
const char* const kCodecs[] = {"f16", "lowrank-r64", "lowrank-r32", "lowrank-r32-int4",
                               "latent-r64"};

double& Bandwidth() {
  static double bandwidth = 0.0;
  return bandwidth;
}

// Rows [num_tokens, kNumKvHeads, kHeadDim] with decaying variances mixed across channels.
std::vector<float> Rows(int num_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> rows(static_cast<size_t>(num_tokens) * kNumKvHeads * kHeadDim);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int c = static_cast<int>(i % kHeadDim);
    rows[i] = normal(rng) * 4.0f / (1.0f + 0.1f * c);
  }
  for (size_t i = 1; i < rows.size(); ++i) rows[i] += 0.5f * rows[i - 1];  // correlate
  return rows;
}

const KvProfile& Profile() {
  static const KvProfile profile = [] {
    std::mt19937 rng(1);
    KvProfile p(1, 1, kNumKvHeads, kHeadDim);
    p.Accumulate(0, Rows(1024, rng), Rows(1024, rng));
    KVS_CHECK(p.Finalize().ok());
    return p;
  }();
  return profile;
}

std::unique_ptr<Codec> MakeCodec(const std::string& name, CodecRole role) {
  auto codec = IsLowRankCodecName(name) ? CreateProfiledCodec(name, Profile(), 0, role)
                                        : CreateCodec(name, kHeadDim, role);
  KVS_CHECK(codec.ok());
  return std::move(*codec);
}

// A paged view, blocks in order; 64 distinct blocks of encoded random rows repeat through the
// arena (the content does not change the time; encoding every token would take minutes). A
// latent layer's value view reads the key arena, as in the cache.
struct BenchCache {
  std::unique_ptr<Codec> k_codec, v_codec;
  std::vector<std::byte> k_arena, v_arena;
  std::vector<int32_t> block_table;
  KvLayerView view;

  BenchCache(int num_tokens, const std::string& name) {
    k_codec = MakeCodec(name, CodecRole::kKey);
    v_codec = MakeCodec(name, CodecRole::kValue);
    const bool joint = k_codec->joint();
    const int num_blocks = (num_tokens + kBlockSize - 1) / kBlockSize;
    block_table.resize(num_blocks);
    for (int b = 0; b < num_blocks; ++b) block_table[b] = b;
    auto layout = [&](const Codec& c, KvArenaView& arena_view) {
      arena_view.codec = c.id();
      arena_view.codec_impl = &c;
      arena_view.unit_bytes = c.unit_bytes();
      // Head-major, as KvCache stores its arenas: [kv head][block][units].
      arena_view.block_stride = arena_view.unit_bytes * kBlockSize;
      arena_view.head_stride = arena_view.block_stride * num_blocks;
    };
    layout(*k_codec, view.k);
    layout(*v_codec, view.v);
    k_arena.resize(view.k.head_stride * kNumKvHeads);
    if (!joint) v_arena.resize(view.v.head_stride * kNumKvHeads);
    std::mt19937 rng(2);
    const int num_distinct = std::min(num_blocks, 64);
    const std::vector<float> k = Rows(num_distinct * kBlockSize, rng);
    const std::vector<float> v = Rows(num_distinct * kBlockSize, rng);
    std::vector<float> k_head(kBlockSize * kHeadDim), v_head(k_head.size());
    for (int b = 0; b < num_blocks; ++b) {
      for (int h = 0; h < kNumKvHeads; ++h) {
        std::byte* k_dst = k_arena.data() + b * view.k.block_stride + h * view.k.head_stride;
        std::byte* v_dst =
            joint ? nullptr : v_arena.data() + b * view.v.block_stride + h * view.v.head_stride;
        if (b >= num_distinct) {  // a copy of an encoded block
          const size_t from = static_cast<size_t>(b % num_distinct);
          std::copy_n(k_arena.data() + from * view.k.block_stride + h * view.k.head_stride,
                      view.k.block_stride, k_dst);
          if (!joint) {
            std::copy_n(v_arena.data() + from * view.v.block_stride + h * view.v.head_stride,
                        view.v.block_stride, v_dst);
          }
          continue;
        }
        for (int t = 0; t < kBlockSize; ++t) {
          const size_t at =
              ((static_cast<size_t>(b) * kBlockSize + t) * kNumKvHeads + h) * kHeadDim;
          std::copy_n(&k[at], kHeadDim, &k_head[t * kHeadDim]);
          std::copy_n(&v[at], kHeadDim, &v_head[t * kHeadDim]);
        }
        if (joint) {
          k_codec->EncodeJointHead(h, k_head, v_head, {k_dst, view.k.block_stride});
        } else {
          k_codec->EncodeHead(h, k_head, {k_dst, view.k.block_stride});
          v_codec->EncodeHead(h, v_head, {v_dst, view.v.block_stride});
        }
      }
    }
    view.k.base = k_arena.data();
    view.v.base = joint ? k_arena.data() : v_arena.data();
    view.block_table = block_table;
    view.block_size = kBlockSize;
    view.num_tokens = num_tokens;
    view.num_kv_heads = kNumKvHeads;
    view.head_dim = kHeadDim;
  }

  // Cache bytes one decode step reads: every key unit, and every value unit unless the values
  // read the key units (latent).
  double BytesPerStep() const {
    const size_t per_token =
        view.k.unit_bytes + (view.v.base == view.k.base ? 0 : view.v.unit_bytes);
    return static_cast<double>(per_token) * view.num_tokens * kNumKvHeads;
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
  std::vector<float> q(static_cast<size_t>(kNumHeads) * kHeadDim);
  for (float& x : q) x = 0.1f * normal(rng);
  std::vector<float> out(q.size());
  const AttentionParams params{kNumHeads, 1.0f / std::sqrt(static_cast<float>(kHeadDim))};
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
      static_cast<double>(num_tokens) * kNumKvHeads / num_threads * 1e-9,
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
      const BenchCache cache(kBlockSize, codec);  // for its unit sizes only
      const double bytes = cache.BytesPerStep() / kBlockSize * tokens;
      const double bits = 8.0 * bytes / (2.0 * tokens * kNumKvHeads * kHeadDim);
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
  kvstack::Profile();  // the bases, before any timing
  kvstack::RegisterAll(long_contexts);
  benchmark::RunSpecifiedBenchmarks();
  kvstack::PrintTable();
  benchmark::Shutdown();
  return 0;
}
