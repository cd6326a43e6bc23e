// Attention kernel benchmarks, reported against the machine's read bandwidth measured at the
// start of the same run (1 GiB buffer, with 1 and with 2 threads). Decode is memory-bound:
// `bytes_per_second` is the cache it reads and `bw_fraction` that rate over the measured
// bandwidth at the same thread count. Prefill is compute-bound: `macs_per_second` counts the
// useful multiply-adds (q.k and p.v over the causal triangle).
//
// Shapes: A = the model benchmark (8 kv heads, 8 query heads, head_dim 64); B = a GQA model
// (8 kv heads, 32 query heads, head_dim 128) in every codec with a fast path. Arguments:
// tokens, threads. Contexts of 32k and 64k tokens run with --long_contexts (the default run
// stays near a minute); --no_tile_multiplies leaves AMX out; --avx2 runs the kernels compiled
// for AVX2 (the readers of AVX2-only CPUs, measured on a CPU with AVX-512). At the end a table
// gives, per context and codec, the time per decode step, the cache read rate, its fraction of the
// bandwidth and the speed-up over bf16 (best of --benchmark_repetitions, default 1).
//
// Scores/<shape>/<codec>: the cost of the attention scores selection policies read
// (AttentionScores) per decode step, as a fraction of the attention time: each iteration runs
// the same step without and with scores, back to back, and the fastest of each is compared,
// so that load from other processes cancels out.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_cache.h"
#include "bench_pool.h"
#include "benchmark/benchmark.h"
#include "hwy/targets.h"
#include "kvstack/codec.h"
#include "kvstack/kv_cache.h"
#include "run/attention.h"
#include "run/attention_kernels.h"
#include "run/memory_bandwidth.h"

namespace kvstack {
namespace {

constexpr int kBlockSize = 16;

// Read bandwidth by thread count, measured in main() before any benchmark runs.
std::map<int, double>& Bandwidth() {
  static std::map<int, double> bandwidth;
  return bandwidth;
}

// One sequence of random tokens in a one-layer paged KvCache (GrowBenchCache), blocks of
// kBlockSize tokens (or the codec's unit, when larger), and its view.
struct BenchCache {
  std::unique_ptr<KvCache> cache;
  KvLayerView view;

  BenchCache(int num_tokens, int num_kv_heads, int head_dim, const std::string& codec) {
    const int unit_len =
        std::max(CreateCodec(codec, head_dim, CodecRole::kKey).value()->group_tokens(),
                 CreateCodec(codec, head_dim, CodecRole::kValue).value()->group_tokens());
    num_tokens = num_tokens / unit_len * unit_len;  // whole units: no pending segment
    std::vector<SeqId> ids;
    // Appended 4096 tokens at a time: the random rows stay small.
    cache = GrowBenchCache({num_kv_heads, head_dim, std::max(kBlockSize, unit_len)}, codec,
                           num_tokens, 4096, 1, &ids);
    view = cache->View(ids[0], 0);
  }
};

// Seconds per decode step by (codec, tokens), the best of the repetitions, for the summary
// tables: wall time of the shape-B runs on kThreadsB threads, and CPU time of the one-thread
// runs (which a loaded machine disturbs less: time spent waiting for memory still counts,
// time other processes hold the core does not).
using StepTimes = std::map<std::pair<std::string, int>, double>;
StepTimes& DecodeTimes() {
  static StepTimes times;
  return times;
}
StepTimes& OneThreadTimes() {
  static StepTimes times;
  return times;
}
// Bytes per second by (codec, tokens): the best MeasureDecodeReadRate of the shape-B caches,
// the same bytes in the same order on as many threads, without the arithmetic.
StepTimes& DecodeReadLimits() {
  static StepTimes rates;
  return rates;
}
// What one shape-B decode step of (codec, tokens) reads, recorded by BM_Decode for the tables
// (which would otherwise build and encode each cache a second time): bytes, and tokens in the view.
struct StepRead {
  double bytes = 0.0;
  int num_tokens = 0;
};
std::map<std::pair<std::string, int>, StepRead>& StepReads() {
  static std::map<std::pair<std::string, int>, StepRead> reads;
  return reads;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

enum class Record { kNone, kWall, kThreadCpu };

void BM_Decode(benchmark::State& state, int num_kv_heads, int num_heads, int head_dim,
               std::string codec, Record record) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  const BenchCache cache(num_tokens, num_kv_heads, head_dim, codec);
  std::vector<float> q(static_cast<size_t>(num_heads) * head_dim, 0.5f);
  std::vector<float> out(q.size());
  const AttentionParams params{num_heads, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  ThreadPool* pool = BenchPool(num_threads);
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ThreadCpuSeconds();
  for (auto _ : state) {
    Attention(cache.view, q.data(), 1, params, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  const double step_bytes = static_cast<double>(DecodeBytesRead(cache.view));
  if (record != Record::kNone) {  // the best repetition: other processes only ever slow a run
    StepReads()[{codec, num_tokens}] = {step_bytes, cache.view.num_tokens};
    const double seconds =
        (record == Record::kWall
             ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
             : ThreadCpuSeconds() - cpu_start) /
        static_cast<double>(state.iterations());
    double& best =
        (record == Record::kWall ? DecodeTimes() : OneThreadTimes())[{codec, num_tokens}];
    best = best == 0.0 ? seconds : std::min(best, seconds);
    if (record == Record::kWall) {
      double& limit = DecodeReadLimits()[{codec, num_tokens}];
      limit = std::max(limit, MeasureDecodeReadRate(cache.view, 5, pool));
    }
  }
  const double bytes = step_bytes * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["bw_fraction"] =
      benchmark::Counter(bytes / Bandwidth()[num_threads], benchmark::Counter::kIsRate);
}

// One row of the scores-cost table: fastest step without and with scores.
struct ScoresCost {
  double off = 0.0, on = 0.0;  // seconds
};
std::map<std::pair<std::string, int>, ScoresCost>& ScoresCosts() {
  static std::map<std::pair<std::string, int>, ScoresCost> costs;
  return costs;
}

void BM_ScoresCost(benchmark::State& state, int num_kv_heads, int num_heads, int head_dim,
                   std::string codec, std::string name) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  const BenchCache cache(num_tokens, num_kv_heads, head_dim, codec);
  std::vector<float> q(static_cast<size_t>(num_heads) * head_dim, 0.5f);
  std::vector<float> out(q.size());
  // H2O's use: keep adding into one buffer.
  std::vector<float> score_rows(static_cast<size_t>(num_kv_heads) * cache.view.num_tokens);
  const AttentionScores scores{score_rows.data(), cache.view.num_tokens, 0, ScoreAggregation::kMax};
  const AttentionParams params{num_heads, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  ThreadPool* pool = BenchPool(num_threads);
  auto time = [&](const AttentionScores* s) {
    const auto start = std::chrono::steady_clock::now();
    Attention(cache.view, q.data(), 1, params, out.data(), pool, s);
    benchmark::DoNotOptimize(out.data());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  ScoresCost best{1e30, 1e30};
  for (auto _ : state) {
    best.off = std::min(best.off, time(nullptr));
    best.on = std::min(best.on, time(&scores));
  }
  state.counters["off_us"] = best.off * 1e6;
  state.counters["on_us"] = best.on * 1e6;
  state.counters["cost_fraction"] = best.on / best.off - 1.0;
  ScoresCost& row = ScoresCosts()[{name, num_tokens}];
  if (row.off == 0.0 || best.off < row.off) row = best;
}

void BM_Prefill(benchmark::State& state, int num_kv_heads, int num_heads, int head_dim,
                std::string codec) {
  const int num_tokens = static_cast<int>(state.range(0));
  const int num_threads = static_cast<int>(state.range(1));
  const BenchCache cache(num_tokens, num_kv_heads, head_dim, codec);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(num_tokens) * num_heads * head_dim);
  for (float& x : q) x = dist(rng);
  std::vector<float> out(q.size());
  const AttentionParams params{num_heads, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  ThreadPool* pool = BenchPool(num_threads);
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

// Shape B's codecs: the floats and every codec with a fast path; int4 also with one (scale,
// min) pair per 128 elements instead of 32, to show what its groups cost, in -t16 tiles (the
// same bytes by column), to show what the transposes cost, and with both.
const char* const kCodecsB[] = {"bf16",     "f16",       "fp8_e4m3",      "int8",  "int4",
                                "int4-t16", "int4-g128", "int4-g128-t16", "kivi4", "kivi2"};
constexpr int kThreadsB = 2;

void RegisterAll(bool long_contexts) {
  for (const char* codec : {"f16", "bf16", "f32", "fp8_e4m3", "fp8_e5m2"}) {
    auto* a = benchmark::RegisterBenchmark((std::string("DecodeA/") + codec).c_str(), BM_Decode, 8,
                                           8, 64, std::string(codec), Record::kNone);
    for (int tokens : {1024, 4096, 16384}) {
      for (int threads : {1, 2}) a->Args({tokens, threads});
    }
    a->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  for (const char* codec : kCodecsB) {
    auto* b = benchmark::RegisterBenchmark((std::string("DecodeB/") + codec).c_str(), BM_Decode,
                                           kShapeB.num_kv_heads, kShapeBQueryHeads,
                                           kShapeB.head_dim, std::string(codec), Record::kWall);
    for (int tokens : {1024, 4096, 16384}) b->Args({tokens, kThreadsB});
    if (long_contexts) {
      for (int tokens : {32768, 65536}) b->Args({tokens, kThreadsB});
    }
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
    // One thread, CPU time: at 1k tokens the cache (4 MiB in bf16) stays in the caches, so
    // this is what the readers cost in arithmetic; at 32k it comes from memory.
    benchmark::RegisterBenchmark((std::string("OneThreadB/") + codec).c_str(), BM_Decode, 8, 32,
                                 128, std::string(codec), Record::kThreadCpu)
        ->Args({1024, 1})
        ->Args({32768, 1})
        ->Unit(benchmark::kMicrosecond);
  }
  // Scores: the foundation shape (A) and shape B, the float codec and int4.
  const struct {
    const char* shape;
    int num_heads, head_dim, threads;
  } score_shapes[] = {{"A", 8, 64, 2}, {"B", kShapeBQueryHeads, kShapeB.head_dim, kThreadsB}};
  for (const auto& shape : score_shapes) {
    for (const char* codec : {"f16", "int4"}) {
      const std::string name = std::string(shape.shape) + "/" + codec;
      benchmark::RegisterBenchmark(("Scores/" + name).c_str(), BM_ScoresCost, 8, shape.num_heads,
                                   shape.head_dim, std::string(codec), name)
          ->Args({4096, shape.threads})
          ->Args({16384, shape.threads})
          ->Iterations(30)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RegisterBenchmark("PrefillA/f16", BM_Prefill, 8, 8, 64, std::string("f16"))
      ->Args({4096, 1})
      ->Args({4096, 2})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  // Prefill of quantised caches against f16, one thread, CPU time: their tiles are decoded to
  // F32 with the SIMD readers (or the codec's own Decode where a format has none, as -t16 tiles).
  for (const char* codec : {"f16", "int8", "int4", "int4-t16", "kivi4", "kivi2"}) {
    benchmark::RegisterBenchmark((std::string("PrefillA1/") + codec).c_str(), BM_Prefill, 8, 8, 64,
                                 std::string(codec))
        ->Args({2048, 1})
        ->Unit(benchmark::kMillisecond);
  }
}

// The shape-B decode table: per context and codec, microseconds per step, GB/s of cache read,
// that rate over the measured bandwidth, the speed-up over bf16 at the same context, and the
// layout's read limit (DecodeReadLimits) with the rate over it.
void PrintDecodeTable() {
  if (DecodeTimes().empty()) return;
  std::printf(
      "\nDecode, 8 kv heads x head_dim 128, 32 query heads, %d threads "
      "(bandwidth %.1f GB/s):\n",
      kThreadsB, Bandwidth()[kThreadsB] / 1e9);
  std::printf("%8s %-13s %10s %8s %9s %8s %10s %9s\n", "tokens", "codec", "us/step", "GB/s",
              "fraction", "vs bf16", "limit GB/s", "of limit");
  std::map<int, double> bf16;
  for (const auto& [key, seconds] : DecodeTimes()) {
    if (key.first == "bf16") bf16[key.second] = seconds;
  }
  for (int tokens : {1024, 4096, 16384, 32768, 65536}) {
    for (const char* codec : kCodecsB) {
      const auto it = DecodeTimes().find({codec, tokens});
      if (it == DecodeTimes().end()) continue;
      const double seconds = it->second;
      const double rate = StepReads()[{codec, tokens}].bytes / seconds;
      const double limit = DecodeReadLimits()[{codec, tokens}];
      std::printf("%8d %-13s %10.1f %8.2f %9.2f %8.2f %10.2f %9.2f\n", tokens, codec, seconds * 1e6,
                  rate / 1e9, rate / Bandwidth()[kThreadsB],
                  bf16.count(tokens) ? bf16[tokens] / seconds : 0.0, limit / 1e9,
                  limit > 0.0 ? rate / limit : 0.0);
    }
  }
}

// The one-thread table: per context and codec, CPU nanoseconds per token and kv head, the cache
// read per CPU second, and the speed-up over bf16.
void PrintOneThreadTable() {
  if (OneThreadTimes().empty()) return;
  std::printf("\nDecode, shape B, one thread, CPU time (read bandwidth 1 thread %.1f GB/s):\n",
              Bandwidth()[1] / 1e9);
  std::printf("%8s %-13s %14s %8s %9s %8s\n", "tokens", "codec", "ns/token/head", "GB/s",
              "fraction", "vs bf16");
  for (int tokens : {1024, 32768}) {
    const auto bf16 = OneThreadTimes().find({"bf16", tokens});
    for (const char* codec : kCodecsB) {
      const auto it = OneThreadTimes().find({codec, tokens});
      if (it == OneThreadTimes().end()) continue;
      const StepRead& read = StepReads()[{codec, tokens}];
      const double rate = read.bytes / it->second;
      std::printf("%8d %-13s %14.1f %8.2f %9.2f %8.2f\n", tokens, codec,
                  1e9 * it->second / (8.0 * read.num_tokens), rate / 1e9, rate / Bandwidth()[1],
                  bf16 != OneThreadTimes().end() ? bf16->second / it->second : 0.0);
    }
  }
}

// The scores-cost table: per shape, codec and context, the fastest decode step without and
// with scores and the extra time as a fraction.
void PrintScoresTable() {
  if (ScoresCosts().empty()) return;
  std::printf("\nAttention scores per decode step (kMax, added into one buffer), %d threads:\n",
              kThreadsB);
  std::printf("%-10s %8s %10s %10s %8s\n", "shape", "tokens", "off us", "on us", "cost");
  for (const auto& [key, cost] : ScoresCosts()) {
    std::printf("%-10s %8d %10.1f %10.1f %7.1f%%\n", key.first.c_str(), key.second, cost.off * 1e6,
                cost.on * 1e6, 100.0 * (cost.on / cost.off - 1.0));
  }
}

}  // namespace
}  // namespace kvstack

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  constexpr size_t kBandwidthBytes = size_t{1} << 30;
  for (int threads : {1, 2}) {
    const double bw =
        kvstack::MeasureReadBandwidth(kBandwidthBytes, 5, kvstack::BenchPool(threads));
    kvstack::Bandwidth()[threads] = bw;
    std::printf("read bandwidth, %d thread(s): %.1f GB/s\n", threads, bw / 1e9);
  }
  bool long_contexts = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--long_contexts") long_contexts = true;
    // The readers without AMX tile multiplies, to compare the two in one binary.
    if (std::string(argv[i]) == "--no_tile_multiplies") {
      kvstack::DisableTileMultipliesForTest(true);
    }
    if (std::string(argv[i]) == "--avx2") {
      if ((hwy::SupportedTargets() & HWY_AVX2) == 0) {
        std::fprintf(stderr, "--avx2: this CPU cannot run the AVX2 kernels\n");
        return 1;
      }
      // Every target above AVX2: Highway numbers better targets with lower bits.
      hwy::DisableTargets(HWY_AVX2 - 1);
    }
  }
  kvstack::RegisterAll(long_contexts);
  benchmark::RunSpecifiedBenchmarks();
  kvstack::PrintDecodeTable();
  kvstack::PrintOneThreadTable();
  kvstack::PrintScoresTable();
  benchmark::Shutdown();
  return 0;
}
