// MatMul benchmarks: decode (GEMV, one token) and prefill (GEMM, 64 tokens) on F32 and F16
// weights, with 1 and 2 threads. Counters: `gflops` (2 * rows * cols * tokens per second) and
// `weight_gbps` (weight bytes read per second, once per call). GEMV is bound by reading the
// weights, so it is also reported as `bw_fraction`: its weight read rate over the rate of a
// plain vectorised read of a buffer of the same size with the same threads, measured in the
// same run (MeasureReadBandwidth) — 1.0 means "as fast as reading the matrix can be".
//
// BM_PoolRunOverhead is the cost of one empty parallel loop, the reference for MatMul's
// single-thread threshold. Arguments: rows, cols, num_tokens, threads. Shapes: the model
// benchmark's 512x512, 1024x512 and 512x1024, and 4096x4096 (32 MiB in F16), well past L2.
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "bench_pool.h"
#include "benchmark/benchmark.h"
#include "kvstack/numeric.h"
#include "run/dense_ops.h"
#include "run/memory_bandwidth.h"

namespace kvstack {
namespace {

// Read bandwidth for a buffer of `bytes` with `num_threads`, measured once per pair.
double ReadBandwidth(size_t bytes, int num_threads) {
  static std::map<std::pair<size_t, int>, double> cache;
  auto [it, inserted] = cache.try_emplace({bytes, num_threads}, 0.0);
  if (inserted) it->second = MeasureReadBandwidth(bytes, 5, BenchPool(num_threads));
  return it->second;
}

struct BenchWeights {
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  WeightMatrix matrix;
};

BenchWeights MakeWeights(WeightType type, int rows, int cols) {
  BenchWeights w;
  std::mt19937 rng(rows * 7 + cols);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t n = static_cast<size_t>(rows) * cols;
  if (type == WeightType::kF16) {
    w.f16.resize(n);
    for (uint16_t& h : w.f16) h = F32ToF16(dist(rng));
    w.matrix.data = w.f16.data();
  } else {
    w.f32.resize(n);
    for (float& f : w.f32) f = dist(rng);
    w.matrix.data = w.f32.data();
  }
  w.matrix.type = type;
  w.matrix.rows = rows;
  w.matrix.cols = cols;
  return w;
}

template <WeightType kType>
void BM_MatMul(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0));
  const int cols = static_cast<int>(state.range(1));
  const int num_tokens = static_cast<int>(state.range(2));
  const int num_threads = static_cast<int>(state.range(3));
  const BenchWeights w = MakeWeights(kType, rows, cols);
  std::vector<float> x(static_cast<size_t>(num_tokens) * cols, 0.5f);
  std::vector<float> y(static_cast<size_t>(num_tokens) * rows);
  ThreadPool* pool = BenchPool(num_threads);
  for (auto _ : state) {
    ops::MatMul(w.matrix, x.data(), num_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * rows * cols * num_tokens;
  const size_t weight_bytes =
      static_cast<size_t>(rows) * cols * (kType == WeightType::kF16 ? 2 : 4);
  state.counters["gflops"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_gbps"] = benchmark::Counter(static_cast<double>(weight_bytes) / 1e9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  if (num_tokens == 1) {
    // (weight_bytes per call / reference bytes per second) per call time = rate / reference.
    state.counters["bw_fraction"] = benchmark::Counter(
        static_cast<double>(weight_bytes) / ReadBandwidth(weight_bytes, num_threads),
        benchmark::Counter::kIsIterationInvariantRate);
  }
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2}) {
    for (auto [rows, cols] : {std::pair{512, 512}, {1024, 512}, {512, 1024}}) {
      for (int num_tokens : {1, 64}) b->Args({rows, cols, num_tokens, threads});
    }
    b->Args({4096, 4096, 1, threads});
  }
  b->ArgNames({"rows", "cols", "tokens", "threads"});
  b->UseRealTime();  // the pool's workers do part of the work: CPU time of main alone misleads
}

BENCHMARK_TEMPLATE(BM_MatMul, WeightType::kF32)->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_MatMul, WeightType::kF16)->Apply(Shapes);

// The fixed cost of one parallel loop (tasks that do nothing), which sets MatMul's threshold
// for going parallel: below it, one thread finishes before the others would have started.
void BM_PoolRunOverhead(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    pool.Run(pool.num_threads(), [](int64_t task_idx, int) { benchmark::DoNotOptimize(task_idx); });
  }
}
BENCHMARK(BM_PoolRunOverhead)->Arg(2)->ArgName("threads")->UseRealTime();

}  // namespace
}  // namespace kvstack

BENCHMARK_MAIN();
