// `kvstack generate`: streams a continuation of a prompt to stdout, and the speed and KV
// memory of the run to stderr (one human line, or one JSON object with --json).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_format.h"
#include "command.h"
#include "options.h"

namespace kvstack::cli {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  int num_tokens = 64;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool json = false;
  CacheFlags cache;
  EngineFlags engine;
};

absl::Status RunGenerate(const GenerateFlags& flags) {
  std::string prompt = flags.prompt;
  if (!flags.prompt_file.empty()) {
    KVS_ASSIGN_OR_RETURN(prompt, ReadTextFile(flags.prompt_file, "prompt file"));
  }
  if (flags.num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--n-predict must be >= 0, got %d", flags.num_tokens));
  }
  const SamplerOptions sampler{flags.temperature, flags.top_k, flags.top_p, flags.seed};
  // Before anything is printed: a bad option must not leave the prompt behind on stdout.
  KVS_RETURN_IF_ERROR(Sampler::Create(sampler).status());
  KVS_ASSIGN_OR_RETURN(KvConfig kv, flags.cache.Resolve());
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(flags.model));
  const Tokenizer& tokenizer = model->tokenizer();
  const std::vector<TokenId> prompt_ids = tokenizer.Encode(prompt, /*add_bos=*/true);
  constexpr int64_t kMaxTokens = std::numeric_limits<int>::max();  // (context_tokens is an int)
  if (static_cast<int64_t>(prompt_ids.size()) + flags.num_tokens > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--n-predict %d: with the prompt's %d tokens, more than %d in all",
                        flags.num_tokens, prompt_ids.size(), kMaxTokens));
  }

  EngineOptions engine_options;
  engine_options.kv = kv;
  engine_options.context_tokens = static_cast<int>(prompt_ids.size()) + flags.num_tokens;
  engine_options.num_threads = flags.engine.threads;
  engine_options.max_batch = flags.engine.batch;
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*model, engine_options));

  GenerateOptions options;
  options.max_new_tokens = flags.num_tokens;
  options.sampler = sampler;
  std::fputs(prompt.c_str(), stdout);
  TokenId prev = prompt_ids.back();
  KVS_ASSIGN_OR_RETURN(GenerateStats stats, Generate(*engine, prompt_ids, options, [&](TokenId id) {
                         std::fputs(tokenizer.TokenText(prev, id).c_str(), stdout);
                         std::fflush(stdout);
                         prev = id;
                       }));
  std::fputs("\n", stdout);
  std::fflush(stdout);

  const KvConfig& resolved = engine->options().kv;
  if (flags.json) {
    nlohmann::json out{{"prompt_tokens", stats.prompt_tokens},
                       {"generated_tokens", stats.generated_tokens},
                       {"prefill_tokens_per_s", stats.prefill_tokens_per_s()},
                       {"decode_tokens_per_s", stats.decode_tokens_per_s()},
                       {"kv_bytes", stats.kv_bytes_in_use},
                       {"kv_f32_row_bytes", stats.kv_f32_row_bytes},
                       {"kv_peak_bytes", engine->cache().peak_bytes_in_use()},
                       {"kv_bytes_reserved", engine->cache().bytes_reserved()},
                       {"kv_bytes_per_token", engine->cache().bytes_per_token()},
                       {"threads", flags.engine.threads},
                       {"config", KvConfigJson(resolved)}};
    std::fprintf(stderr, "%s\n", out.dump().c_str());
  } else {
    const std::string f32_rows =
        stats.kv_f32_row_bytes == 0
            ? ""
            : absl::StrFormat(", %zu in F32 sink and recent rows", stats.kv_f32_row_bytes);
    std::fprintf(stderr,
                 "prefill %d tokens at %.1f tokens/s | decode %d tokens at %.1f tokens/s | KV "
                 "%zu bytes in use (at most %zu): %zu in blocks (%.2f B/token, %zu reserved)%s | "
                 "%s\n",
                 stats.prompt_tokens, stats.prefill_tokens_per_s(), stats.generated_tokens,
                 stats.decode_tokens_per_s(), stats.kv_bytes_in_use,
                 engine->cache().peak_bytes_in_use(),
                 stats.kv_bytes_in_use - stats.kv_f32_row_bytes, engine->cache().bytes_per_token(),
                 engine->cache().bytes_reserved(), f32_rows.c_str(), resolved.ToString().c_str());
  }
  return absl::OkStatus();
}

}  // namespace

RunFn RegisterGenerate(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt");
  sub->add_option("--model,-m", flags->model, "GGUF model file")->required();
  auto* prompt = sub->add_option("--prompt,-p", flags->prompt, "prompt text");
  auto* prompt_file =
      sub->add_option("--prompt-file,-f", flags->prompt_file, "file holding the prompt");
  prompt->excludes(prompt_file);
  prompt_file->excludes(prompt);
  sub->add_option("-n,--n-predict", flags->num_tokens, "tokens to generate (default 64)");
  sub->add_option("--temp", flags->temperature, "temperature; 0 = greedy (default 0)");
  sub->add_option("--top-k", flags->top_k, "keep the k most likely tokens; 0 = all (default 0)");
  sub->add_option("--top-p", flags->top_p, "nucleus mass in (0, 1] (default 1)");
  sub->add_option("--seed", flags->seed, "sampling seed (default 0)");
  sub->add_flag("--json", flags->json, "print the statistics as one JSON object on stderr");
  flags->cache.Add(sub);
  flags->engine.Add(sub);
  return [flags, prompt, prompt_file]() -> absl::Status {
    if (prompt->count() == 0 && prompt_file->count() == 0) {
      return absl::InvalidArgumentError("generate: give --prompt or --prompt-file");
    }
    return RunGenerate(*flags);
  };
}

}  // namespace kvstack::cli
