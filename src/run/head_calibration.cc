// MeasureHeadProfile: attention mass outside sinks + recent window, per (layer, kv head).
#include "run/head_calibration.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "kvstack/engine.h"

namespace kvstack {

absl::StatusOr<HeadProfile> MeasureHeadProfile(const LlamaModel& model,
                                               std::span<const TokenId> tokens,
                                               const HeadCalibrationOptions& options) {
  if (options.sink_tokens < 0 || options.recent_tokens < 1 || options.max_windows < 1 ||
      options.ctx <= options.sink_tokens + options.recent_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "head calibration: need sinks >= 0, window >= 1, windows >= 1 and ctx > sinks + window; "
        "got sinks %d, window %d, windows %d, ctx %d",
        options.sink_tokens, options.recent_tokens, options.max_windows, options.ctx));
  }
  const int num_windows =
      std::min<int>(options.max_windows, static_cast<int>(tokens.size() / options.ctx));
  if (num_windows < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head calibration: the text has %d tokens, fewer than one window of %d",
                        tokens.size(), options.ctx));
  }
  EngineOptions engine_options;
  engine_options.kv.k_codec = engine_options.kv.v_codec = "f32";
  engine_options.context_tokens = options.ctx;
  engine_options.num_threads = options.num_threads;
  engine_options.max_batch = 1;
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, engine_options));

  const LlamaHparams& hp = model.hparams();
  const size_t num_heads = static_cast<size_t>(hp.num_layers) * hp.num_kv_heads;
  std::vector<double> mass_sum(num_heads, 0.0);
  int64_t queries = 0;  // observed queries with a middle, per head
  int num_tokens = 0;   // tokens the current sequence holds (the query is the last)
  KVS_RETURN_IF_ERROR(
      engine->SetAttentionObserver([&](int layer, std::span<const float> scores, int stride) {
        const int middle_begin = options.sink_tokens;
        const int middle_end = num_tokens - options.recent_tokens;
        if (middle_end <= middle_begin) return;
        for (int h = 0; h < hp.num_kv_heads; ++h) {
          double mass = 0;
          for (int t = middle_begin; t < middle_end; ++t) mass += scores[h * stride + t];
          mass_sum[static_cast<size_t>(layer) * hp.num_kv_heads + h] += mass;
        }
        if (layer == 0) ++queries;
      }));

  std::vector<float> logits;
  std::vector<TokenId> window(options.ctx);
  for (int w = 0; w < num_windows; ++w) {
    std::copy_n(tokens.begin() + static_cast<size_t>(w) * options.ctx, options.ctx, window.begin());
    window[0] = model.tokenizer().bos_id();
    KVS_ASSIGN_OR_RETURN(SeqId seq, engine->NewSequence());
    for (int t = 0; t < options.ctx; ++t) {
      num_tokens = t + 1;
      const absl::Status status =
          engine->Forward(seq, std::span(window).subspan(t, 1), false, &logits);
      if (!status.ok()) {
        engine->FreeSequence(seq).IgnoreError();
        return status;
      }
    }
    KVS_RETURN_IF_ERROR(engine->FreeSequence(seq));
  }
  HeadProfile profile(model.gguf().ContentHash(), hp.num_layers, hp.num_kv_heads);
  for (int layer = 0; layer < hp.num_layers; ++layer) {
    for (int h = 0; h < hp.num_kv_heads; ++h) {
      const double mean = mass_sum[static_cast<size_t>(layer) * hp.num_kv_heads + h] / queries;
      profile.set_score(layer, h, std::clamp(mean, 0.0, 1.0));
    }
  }
  return profile;
}

}  // namespace kvstack
