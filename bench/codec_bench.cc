// Encode cost of the scaled codecs (int8, fp8_e4m3) per token and kv head, one thread, by how
// each token's scale is chosen (scale_search.h): 0 plain (no search), 1 the scalar search
// (the reference, and what the codecs ran before the Highway kernel), 2 the Highway search
// (what CreateCodec's codecs run). Arguments: head_dim, search. Counters: ns_per_token, and
// x_plain: that over the plain encode's ns per token, timed in the same run on the same rows.
// (Google Benchmark prints both with an "s": they are inverted rates, read them as plain numbers.)
// Rows are N(0, 1) with two outlier channels, 64 tokens per Encode call (as an append of a
// block would), so the rows stay in L1/L2 and the figure is the arithmetic's.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "kvstack/check.h"
#include "kvstack/codec.h"
#include "represent/scale_search.h"

namespace kvstack {
namespace {

constexpr int kTokens = 64;
constexpr const char* kCodecs[] = {"int8", "fp8_e4m3"};

std::vector<float> Rows(int head_dim) {
  std::mt19937 rng(17 + head_dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(static_cast<size_t>(kTokens) * head_dim);
  for (float& x : rows) x = normal(rng);
  for (int t = 0; t < kTokens; ++t) {
    rows[static_cast<size_t>(t) * head_dim + 1 % head_dim] *= 10.0f;
    rows[static_cast<size_t>(t) * head_dim + head_dim / 2] *= 10.0f;
  }
  return rows;
}

std::unique_ptr<Codec> MakeCodec(const char* name, int head_dim, ScaleSearch search) {
  auto codec = CreateScaledCodec(name, head_dim, search);
  KVS_CHECK(codec.ok());
  return *std::move(codec);
}

// ns per token of the plain encode, best of 5 timed runs, once per (codec, head_dim).
double PlainNsPerToken(const char* name, int head_dim) {
  static std::map<std::tuple<std::string, int>, double> cache;
  auto [it, inserted] = cache.try_emplace({name, head_dim}, 0.0);
  if (!inserted) return it->second;
  const std::unique_ptr<Codec> codec = MakeCodec(name, head_dim, ScaleSearch::kPlain);
  const std::vector<float> rows = Rows(head_dim);
  std::vector<std::byte> units(kTokens * codec->unit_bytes());
  constexpr int kCalls = 2000;
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      codec->Encode(rows, units);
      benchmark::DoNotOptimize(units.data());
      benchmark::ClobberMemory();
    }
    const std::chrono::duration<double, std::nano> elapsed =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count() / (static_cast<double>(kCalls) * kTokens));
  }
  it->second = best;
  return best;
}

void BM_Encode(benchmark::State& state, const char* name) {
  const int head_dim = static_cast<int>(state.range(0));
  const auto search = static_cast<ScaleSearch>(state.range(1));
  const double plain_ns = PlainNsPerToken(name, head_dim);
  const std::unique_ptr<Codec> codec = MakeCodec(name, head_dim, search);
  const std::vector<float> rows = Rows(head_dim);
  std::vector<std::byte> units(kTokens * codec->unit_bytes());
  for (auto _ : state) {
    codec->Encode(rows, units);
    benchmark::DoNotOptimize(units.data());
    benchmark::ClobberMemory();
  }
  const double tokens = static_cast<double>(state.iterations()) * kTokens;
  // Inverted rates: seconds per (tokens * 1e-9) is ns per token; per (tokens * plain ns *
  // 1e-9), the ratio to the plain encode.
  state.counters["ns_per_token"] =
      benchmark::Counter(tokens * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["x_plain"] = benchmark::Counter(
      tokens * plain_ns * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"head_dim", "search"});
  for (const int head_dim : {8, 64, 128}) {
    for (const int search : {0, 1, 2}) b->Args({head_dim, search});
  }
}

BENCHMARK_CAPTURE(BM_Encode, int8, kCodecs[0])->Apply(Args);
BENCHMARK_CAPTURE(BM_Encode, fp8_e4m3, kCodecs[1])->Apply(Args);

}  // namespace
}  // namespace kvstack

BENCHMARK_MAIN();
