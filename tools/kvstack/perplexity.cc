// `kvstack perplexity`: llama.cpp-compatible perplexity of a model on a text file, through
// the chosen cache design, with a progress bar; --json prints one JSON object.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "command.h"
#include "options.h"
#include "run/evaluate.h"
#include "run/sequence_logits.h"

namespace kvstack::cli {
namespace {

struct PerplexityFlags {
  std::string model;
  std::string file;
  int ctx = 512;
  bool json = false;
  CacheFlags cache;
  EngineFlags engine;
};

absl::Status RunPerplexity(const PerplexityFlags& flags) {
  KVS_ASSIGN_OR_RETURN(KvConfig kv, flags.cache.Resolve());
  KVS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(flags.file, "text file"));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(flags.model));
  const std::vector<TokenId> tokens = model->tokenizer().Encode(text, /*add_bos=*/true);

  EngineOptions engine_options;
  engine_options.kv = kv;
  engine_options.context_tokens = flags.ctx;
  engine_options.num_threads = flags.engine.threads;
  // An evicting cache acts between forward calls: its default is short calls (kEvictingBatch).
  const int batch = flags.engine.batch_given() || !kv.evicts()
                        ? std::min(flags.engine.batch, flags.ctx)
                        : kEvictingBatch;
  engine_options.max_batch = batch;
  PerplexityOptions options;
  options.ctx = flags.ctx;
  options.batch = batch;
  // Before the engine: a --ctx longer than the text must not allocate a cache of --ctx tokens.
  KVS_RETURN_IF_ERROR(CheckPerplexityOptions(tokens.size(), options));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*model, engine_options));

  PerplexityResult result;
  {
    ProgressBar bar("perplexity");
    KVS_ASSIGN_OR_RETURN(result, Perplexity(*engine, tokens, options,
                                            [&](int done, int total) { bar.Update(done, total); }));
  }
  const KvConfig& resolved = engine->options().kv;
  const double bits_at_ctx =
      BitsPerElementOfContext(model->hparams(), result.peak_cache_bytes, flags.ctx);
  if (flags.json) {
    nlohmann::json out{{"ppl", result.ppl},
                       {"ppl_stderr", result.ppl_stderr},
                       {"mean_nll", result.mean_nll},
                       {"tokens_scored", result.tokens_scored},
                       {"windows", result.num_windows},
                       {"ctx", flags.ctx},
                       {"peak_cache_bytes", result.peak_cache_bytes},
                       {"bits_at_ctx", bits_at_ctx},
                       {"config", KvConfigJson(resolved)}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("PPL = %.4f +/- %.5f  (%lld tokens scored in %d windows of %d; %s)\n", result.ppl,
                result.ppl_stderr, static_cast<long long>(result.tokens_scored), result.num_windows,
                flags.ctx, resolved.ToString().c_str());
    std::printf(
        "KV cache: at most %zu bytes in use in a window (%.2f bits per element of its %d "
        "tokens, F32 rows included)\n",
        result.peak_cache_bytes, bits_at_ctx, flags.ctx);
  }
  return absl::OkStatus();
}

}  // namespace

RunFn RegisterPerplexity(CLI::App& app) {
  auto flags = std::make_shared<PerplexityFlags>();
  CLI::App* sub = app.add_subcommand(
      "perplexity", "Perplexity on a text file, scored the way llama.cpp's llama-perplexity does");
  sub->add_option("--model,-m", flags->model, "GGUF model file")->required();
  sub->add_option("--file,-f", flags->file, "text file")->required();
  sub->add_option("--ctx,-c", flags->ctx, "window length in tokens (default 512)");
  sub->add_flag("--json", flags->json, "print the result as one JSON object on stdout");
  flags->cache.Add(sub);
  flags->engine.Add(sub);
  return [flags]() { return RunPerplexity(*flags); };
}

}  // namespace kvstack::cli
