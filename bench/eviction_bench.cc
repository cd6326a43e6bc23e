// The cost of score-based policies (H2O, SnapKV) per decode step, as a fraction of the attention it
// rides on (issue 4's target: at most 10 %). A real KvCache (paged, block 16; 32 for KIVI-g32) of
// one layer holds a full budget of `context` tokens; each step appends one token, runs decode
// attention once without scores (the reference, same state) and once with the scores H2O reads,
// then lets the engine's Evictor select and retain (with the default evict_step, budget / 16 at
// most 128, the rows move once per step tokens; --evict-step 1 moves them every step). Reported:
// attention time without scores, and the extra time of the scores and of the eviction, as fractions
// of it: medians over the steps by default (below), means with --mean.
//
//   eviction_bench [--steps N] [--threads T] [--evict-step S] [--policy P] [--codec C] [--mean]
// (--policy and --codec run only the rows of that policy or codec: for profiling one row.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kvstack/codec.h"
#include "kvstack/kv_cache.h"
#include "run/attention.h"
#include "run/eviction.h"

namespace kvstack {
namespace {

struct Shape {
  const char* name;
  int num_kv_heads, num_heads, head_dim;
};

struct Cost {
  double attention_us = 0;  // per step, without scores
  double scores_fraction = 0;
  double eviction_fraction = 0;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// 0 for none.
double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  return values[mid];
}

Cost Measure(const Shape& shape, const std::string& policy, const std::string& codec, int context,
             int steps, int evict_step, bool mean, ThreadPool* pool) {
  LlamaHparams hparams;
  hparams.num_layers = 1;
  hparams.num_heads = shape.num_heads;
  hparams.num_kv_heads = shape.num_kv_heads;
  hparams.head_dim = shape.head_dim;
  hparams.rope_dim = shape.head_dim;
  KvConfig config;
  config.k_codec = config.v_codec = codec;
  config.policy = policy;
  config.budget = ParseKvBudget(std::to_string(context)).value();
  config.evict_step = evict_step;
  const int total = context + steps + 1;
  std::unique_ptr<Evictor> evictor =
      Evictor::Create(hparams, /*model_hash=*/0, config, total, /*bytes_per_token=*/0).value();
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = shape.num_kv_heads;
  options.head_dim = shape.head_dim;
  options.config = config;
  options.config.capacity = context + 1;
  // Blocks hold whole units (KIVI's keys group 32 tokens).
  options.config.block_size =
      std::max(options.config.block_size,
               CreateCodec(codec, shape.head_dim, CodecRole::kKey).value()->group_tokens());
  std::unique_ptr<KvCache> cache = KvCache::Create(options).value();
  const SeqId seq = cache->AddSequence().value();
  evictor->AddSequence(seq, context + 1);

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t row = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
  std::vector<float> k(row * 256), v(row * 256);
  std::vector<float> q(static_cast<size_t>(shape.num_heads) * shape.head_dim);
  std::vector<float> out(q.size());
  const AttentionParams params{shape.num_heads, 1.0f / std::sqrt(float(shape.head_dim))};
  int position = 0;
  // What one measured step took.
  struct StepTimes {
    double plain = 0, scored = 0, eviction = 0;
    bool asked = false;    // the policy asked for scores (scored is then its own call)
    bool evicted = false;  // the step's EndLayerStep moved rows
  };
  // Appends n tokens and runs the layer's step: attention with the evictor's scores, and
  // its selection.
  auto step = [&](int n) {
    for (size_t i = 0; i < row * n; ++i) k[i] = normal(rng);
    for (size_t i = 0; i < row * n; ++i) v[i] = normal(rng);
    for (float& x : q) x = normal(rng);
    const AppendPlan plan = cache->PlanAppend(seq, n).value();
    KVS_CHECK(plan.fits);
    KVS_CHECK(cache->CommitAppend(plan).ok());
    cache->Write(seq, 0, cache->NumTokens(seq) - n, std::span(k).first(row * n),
                 std::span(v).first(row * n));
    const AttentionScores* scores = evictor->BeginLayerStep(seq, 0, position, n, 1);
    const KvLayerView view = cache->View(seq, 0);
    // The two calls alternate which goes first, so neither always finds the cache warmed by
    // the other. The scored call adds into the evictor's scores once, as a real step does; the
    // plain one reads the same view.
    auto timed = [&](const AttentionScores* s) {
      const auto start = std::chrono::steady_clock::now();
      Attention(view, q.data(), 1, params, out.data(), pool, s);
      return Seconds(start);
    };
    StepTimes times;
    // A step that asks for no scores (a per-step policy within its budget) costs nothing extra.
    const AttentionScores* asked = scores;
    times.asked = asked != nullptr;
    if (position % 2 == 0) {
      times.plain = timed(nullptr);
      times.scored = asked != nullptr ? timed(asked) : times.plain;
    } else {
      times.scored = asked != nullptr ? timed(asked) : timed(nullptr);
      times.plain = asked != nullptr ? timed(nullptr) : times.scored;
    }
    const int before = cache->NumTokens(seq);
    const auto start = std::chrono::steady_clock::now();
    KVS_CHECK(evictor->EndLayerStep(seq, 0, *cache).ok());
    times.eviction = Seconds(start);
    times.evicted = cache->NumTokens(seq) < before;
    position += n;
    return times;
  };
  // Fill to the budget (one query per chunk: the fill is not measured).
  for (int t = 0; t < context; t += 256) step(std::min(256, context - t));
  std::vector<StepTimes> measured;
  for (int s = 0; s < steps; ++s) measured.push_back(step(1));

  if (mean) {
    double plain_sum = 0, scored_sum = 0, eviction_sum = 0;
    for (const StepTimes& t : measured) {
      plain_sum += t.plain;
      scored_sum += t.scored;
      eviction_sum += t.eviction;
    }
    return Cost{plain_sum / steps * 1e6, (scored_sum - plain_sum) / plain_sum,
                eviction_sum / plain_sum};
  }
  // Medians, not means: the machine is shared, and a step during which another process took
  // the core would otherwise count its wait as our cost. Attention: the median step. Scores:
  // each step that asked for them at the median of scored - plain (the pair runs back to
  // back), the others at 0 (no extra call). Eviction: every step's EndLayerStep, with the
  // steps that moved rows (one in evict_step) each at their median.
  std::vector<double> plain, extra, moves;
  double still = 0;  // EndLayerStep of the steps that moved nothing
  for (const StepTimes& t : measured) {
    plain.push_back(t.plain);
    if (t.asked) extra.push_back(t.scored - t.plain);
    if (t.evicted) {
      moves.push_back(t.eviction);
    } else {
      still += t.eviction;
    }
  }
  const double plain_s = Median(plain);
  const double eviction = (still + Median(moves) * moves.size()) / steps;
  const double scores = Median(extra) * extra.size() / steps;
  return Cost{plain_s * 1e6, scores / plain_s, eviction / plain_s};
}

}  // namespace
}  // namespace kvstack

int main(int argc, char** argv) {
  int steps = 64, threads = 2, evict_step = 0;
  std::string only_policy, only_codec;
  bool mean = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--mean") {
      mean = true;
      continue;
    }
    if (flag == "--steps") steps = std::atoi(value);
    if (flag == "--threads") threads = std::atoi(value);
    if (flag == "--evict-step") evict_step = std::atoi(value);
    if (flag == "--policy") only_policy = value;
    if (flag == "--codec") only_codec = value;
    ++i;  // every other flag takes a value
  }
  kvstack::ThreadPool pool(threads);
  const kvstack::Shape shapes[] = {{"A: 8 kv x 64, GQA 1", 8, 8, 64},
                                   {"B: 8 kv x 128, GQA 4", 8, 32, 128}};
  std::printf(
      "Per decode step (%s), %d steps, %d threads, paged block 16 (KIVI: 32), one layer, "
      "evict_step %d "
      "(0 = auto)\n\n",
      mean ? "means" : "medians", steps, threads, evict_step);
  std::printf(
      "| policy | shape | codec | context | attention µs/step | scores / attention | eviction / "
      "attention | total |\n|---|---|---|---:|---:|---:|---:|---:|\n");
  for (const char* policy : {"h2o", "snapkv"}) {
    if (!only_policy.empty() && only_policy != policy) continue;
    for (const kvstack::Shape& shape : shapes) {
      for (const char* codec : {"f16", "int4-g32", "kivi4-g32"}) {
        if (!only_codec.empty() && only_codec != codec) continue;
        for (int context : {4096, 16384}) {
          const kvstack::Cost cost =
              kvstack::Measure(shape, policy, codec, context, steps, evict_step, mean, &pool);
          std::printf("| %s | %s | %s | %d | %.1f | %.1f %% | %.1f %% | %.1f %% |\n", policy,
                      shape.name, codec, context, cost.attention_us, 100 * cost.scores_fraction,
                      100 * cost.eviction_fraction,
                      100 * (cost.scores_fraction + cost.eviction_fraction));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
