// `kvstack bench`: prefill and decode speed of a model at several cache depths, and — in the
// same run — the machine's memory read bandwidth, so the decode step's cache reads can be
// stated as a fraction of what the memory can deliver (absolute times drift on shared
// machines; ratios measured together hold).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/thread_pool.h"
#include "command.h"
#include "options.h"
#include "run/memory_bandwidth.h"

namespace kvstack::cli {
namespace {

struct BenchFlags {
  std::string model;
  std::string depths = "1024,4096,16384";
  int decode_tokens = 32;
  int bandwidth_mib = 1024;
  bool json = false;
  CacheFlags cache;
  EngineFlags engine;
};

struct DepthResult {
  int depth = 0;
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  double step_ms = 0;
  double attention_ms = 0;
  double cache_bytes_per_step = 0;
  size_t peak_cache_bytes = 0;  // the most the cache held: depth + decode tokens, F32 rows too
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::StatusOr<DepthResult> RunDepth(const LlamaModel& model, const BenchFlags& flags,
                                     const KvConfig& kv, int depth) {
  EngineOptions options;
  options.kv = kv;
  options.context_tokens = depth + flags.decode_tokens;
  options.num_threads = flags.engine.threads;
  options.max_batch = flags.engine.batch;
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, options));
  KVS_ASSIGN_OR_RETURN(SeqId seq, engine->NewSequence());
  // Random tokens: speed does not depend on content, and any depth is reachable.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(3, model.hparams().vocab_size - 1);
  std::vector<TokenId> prompt(depth);
  prompt[0] = model.tokenizer().bos_id();
  for (int i = 1; i < depth; ++i) prompt[i] = pick(rng);
  std::vector<float> logits;
  double start = Now();
  KVS_RETURN_IF_ERROR(engine->Forward(seq, prompt, false, &logits));
  DepthResult result;
  result.depth = depth;
  result.prefill_tokens_per_s = depth / (Now() - start);

  engine->ResetProfile();
  start = Now();
  for (int i = 0; i < flags.decode_tokens; ++i) {
    const TokenId next =
        static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    KVS_RETURN_IF_ERROR(engine->Forward(seq, std::span<const TokenId>(&next, 1), false, &logits));
  }
  const double decode_seconds = Now() - start;
  const EngineProfile& profile = engine->profile();
  result.decode_tokens_per_s = flags.decode_tokens / decode_seconds;
  result.step_ms = 1e3 * decode_seconds / flags.decode_tokens;
  result.attention_ms = 1e3 * profile.attention_seconds / flags.decode_tokens;
  result.cache_bytes_per_step = profile.cache_bytes_read / flags.decode_tokens;
  result.peak_cache_bytes = engine->cache().peak_bytes_in_use();  // a new engine: this depth's
  return result;
}

absl::Status RunBench(const BenchFlags& flags) {
  if (flags.decode_tokens < 1) return absl::InvalidArgumentError("--decode must be >= 1");
  if (flags.bandwidth_mib < 16) return absl::InvalidArgumentError("--bandwidth-mib must be >= 16");
  std::vector<int> depths;
  for (absl::string_view part : absl::StrSplit(flags.depths, ',')) {
    int depth = 0;
    if (!absl::SimpleAtoi(part, &depth) || depth < 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--depths: '%s' is not a token count >= 2 (expected e.g. 1024,4096,16384)", part));
    }
    depths.push_back(depth);
  }
  KVS_ASSIGN_OR_RETURN(KvConfig kv, flags.cache.Resolve());
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(flags.model));

  ThreadPool pool(flags.engine.threads);
  const size_t bandwidth_bytes = static_cast<size_t>(flags.bandwidth_mib) << 20;
  const double bandwidth_before = MeasureReadBandwidth(bandwidth_bytes, 5, &pool);
  std::vector<DepthResult> results;
  for (int depth : depths) {
    KVS_ASSIGN_OR_RETURN(DepthResult r, RunDepth(*model, flags, kv, depth));
    results.push_back(r);
    if (!flags.json) {
      std::fprintf(stderr, "depth %d done: prefill %.0f tokens/s, decode %.1f tokens/s\n", depth,
                   r.prefill_tokens_per_s, r.decode_tokens_per_s);
    }
  }
  const double bandwidth_after = MeasureReadBandwidth(bandwidth_bytes, 5, &pool);
  // The better of the two readings is the reference: a conservative denominator.
  const double bandwidth = std::max(bandwidth_before, bandwidth_after);

  const LlamaHparams& hp = model->hparams();
  nlohmann::json rows = nlohmann::json::array();
  if (!flags.json) {
    std::printf(
        "model %s: %d layers, dim %d, %d heads, %d kv heads, head_dim %d | %s | %d threads\n",
        flags.model.c_str(), hp.num_layers, hp.dim, hp.num_heads, hp.num_kv_heads, hp.head_dim,
        kv.ToString().c_str(), pool.num_threads());
    std::printf("memory read bandwidth, same run: %.1f GB/s (before %.1f, after %.1f)\n",
                bandwidth / 1e9, bandwidth_before / 1e9, bandwidth_after / 1e9);
    std::printf(
        "| depth | prefill tok/s | decode tok/s | step ms | attention ms | cache MB/step "
        "| attention GB/s | attention BW fraction | step BW fraction | KV MB held |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const DepthResult& r : results) {
    const double attention_bps = r.cache_bytes_per_step / (r.attention_ms / 1e3);
    const double step_bps = r.cache_bytes_per_step / (r.step_ms / 1e3);
    if (flags.json) {
      rows.push_back({{"depth", r.depth},
                      {"prefill_tokens_per_s", r.prefill_tokens_per_s},
                      {"decode_tokens_per_s", r.decode_tokens_per_s},
                      {"step_ms", r.step_ms},
                      {"attention_ms", r.attention_ms},
                      {"cache_bytes_per_step", r.cache_bytes_per_step},
                      {"attention_bandwidth_fraction", attention_bps / bandwidth},
                      {"step_bandwidth_fraction", step_bps / bandwidth},
                      {"peak_cache_bytes", r.peak_cache_bytes}});
    } else {
      std::printf("| %d | %.0f | %.1f | %.2f | %.2f | %.1f | %.1f | %.2f | %.2f | %.1f |\n",
                  r.depth, r.prefill_tokens_per_s, r.decode_tokens_per_s, r.step_ms, r.attention_ms,
                  r.cache_bytes_per_step / 1e6, attention_bps / 1e9, attention_bps / bandwidth,
                  step_bps / bandwidth, r.peak_cache_bytes / 1e6);
    }
  }
  if (flags.json) {
    nlohmann::json out{{"model", flags.model},
                       {"threads", pool.num_threads()},
                       {"bandwidth_bytes_per_s", bandwidth},
                       {"config", KvConfigJson(kv)},
                       {"depths", rows}};
    std::printf("%s\n", out.dump(2).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

RunFn RegisterBench(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Prefill/decode speed at several depths vs. memory bandwidth measured in the same run");
  sub->add_option("--model,-m", flags->model, "GGUF model file")->required();
  sub->add_option("--depths", flags->depths,
                  "comma-separated cache depths (default 1024,4096,16384)");
  sub->add_option("--decode", flags->decode_tokens, "decode steps timed per depth (default 32)");
  sub->add_option("--bandwidth-mib", flags->bandwidth_mib,
                  "buffer for the bandwidth probe, MiB (default 1024)");
  sub->add_flag("--json", flags->json, "print the results as JSON on stdout");
  flags->cache.Add(sub);
  flags->engine.Add(sub);
  return [flags]() { return RunBench(*flags); };
}

}  // namespace kvstack::cli
