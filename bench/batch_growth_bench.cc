// Decode attention over a KvCache whose sequences grew at the same time, against the same
// sequences grown one after another: whether the block allocator keeps a sequence's blocks
// adjacent (BlockPool::AllocateAfter) decides whether each of its kv heads is one run of memory
// in the head-major arenas or a run per block.
//
// Grown/<order>/<codec>: shape B (8 kv heads x head_dim 128, 32 query heads), paged with
// blocks of 16 tokens, 4 sequences of `tokens` tokens each; "alone" appends each sequence's
// tokens in one go, "lockstep" a block's worth per sequence in turn, as sequences decoding in
// one batch grow. A step is one decode query against sequence 0. Arguments: tokens, threads.
// At the end a table gives, per context, lockstep's time over alone's (best of
// --benchmark_repetitions).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_cache.h"
#include "bench_pool.h"
#include "benchmark/benchmark.h"
#include "kvstack/kv_cache.h"
#include "run/attention.h"

namespace kvstack {
namespace {

constexpr int kNumSequences = 4;

// Fastest step per (lockstep, tokens), seconds.
std::map<std::pair<bool, int>, double>& BestTimes() {
  static std::map<std::pair<bool, int>, double> times;
  return times;
}

void BM_Grown(benchmark::State& state, bool lockstep, std::string codec) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  std::vector<SeqId> ids;
  const std::unique_ptr<KvCache> cache = GrowBenchCache(
      kShapeB, codec, num_tokens, lockstep ? kShapeB.block_size : num_tokens, kNumSequences, &ids);
  const KvLayerView view = cache->View(ids[0], 0);
  std::vector<float> q(static_cast<size_t>(kShapeBQueryHeads) * kShapeB.head_dim, 0.5f);
  std::vector<float> out(q.size());
  const AttentionParams params{kShapeBQueryHeads,
                               1.0f / std::sqrt(static_cast<float>(kShapeB.head_dim))};
  ThreadPool* pool = BenchPool(num_threads);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    Attention(view, q.data(), 1, params, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  double& best = BestTimes()[{lockstep, num_tokens}];
  best = best == 0.0 ? seconds : std::min(best, seconds);
  // How many runs of adjacent blocks sequence 0 is made of.
  int runs = 1;
  for (size_t i = 1; i < view.block_table.size(); ++i) {
    runs += view.block_table[i] != view.block_table[i - 1] + 1;
  }
  state.counters["block_runs"] = runs;
}

void PrintTable() {
  std::printf("\nDecode of one of %d sequences, shape B, bf16, blocks of %d tokens:\n",
              kNumSequences, kShapeB.block_size);
  std::printf("%8s %12s %12s %10s\n", "tokens", "alone us", "lockstep us", "ratio");
  for (const auto& [key, alone] : BestTimes()) {
    if (key.first) continue;
    const auto lockstep = BestTimes().find({true, key.second});
    if (lockstep == BestTimes().end()) continue;
    std::printf("%8d %12.1f %12.1f %10.2f\n", key.second, alone * 1e6, lockstep->second * 1e6,
                lockstep->second / alone);
  }
}

}  // namespace
}  // namespace kvstack

int main(int argc, char** argv) {
  bool long_contexts = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--long_contexts") {
      long_contexts = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  int num_args = static_cast<int>(args.size());
  benchmark::Initialize(&num_args, args.data());
  for (const bool lockstep : {false, true}) {
    auto* b = benchmark::RegisterBenchmark(
        (std::string("Grown/") + (lockstep ? "lockstep" : "alone") + "/bf16").c_str(),
        kvstack::BM_Grown, lockstep, std::string("bf16"));
    for (int tokens : {4096, 16384}) b->Args({tokens, 2});
    if (long_contexts) b->Args({65536, 2});
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  kvstack::PrintTable();
  benchmark::Shutdown();
  return 0;
}
