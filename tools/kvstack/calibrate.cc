// `kvstack calibrate`: runs a model over real text with a full-precision cache and measures,
// per layer and kv head, the principal components of the keys (as stored: after RoPE), of the
// values and of the joint [k; v] (for latent codecs). Writes a profile keyed to the model and
// prints how much energy low ranks keep.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "calibrate_heads.h"
#include "command.h"
#include "kvstack/kv_profile.h"
#include "options.h"

namespace kvstack::cli {
namespace {

struct CalibrateFlags {
  std::string model;
  std::string file;
  std::string out;
  int ctx = 512;
  int max_windows = 16;
  bool heads = false;
  CalibrateHeadsFlags head_flags;
  EngineFlags engine;
};

// Copies one layer's stored keys or values back to rows [num_tokens, num_kv_heads, head_dim].
std::vector<float> LayerRows(const KvLayerView& view, bool keys) {
  const KvArenaView& arena = keys ? view.k : view.v;
  const size_t width = static_cast<size_t>(view.num_kv_heads) * view.head_dim;
  std::vector<float> rows(static_cast<size_t>(view.num_tokens) * width);
  view.ForEachRun(0, view.num_tokens, [&](int logical, int count, int32_t block, int row) {
    for (int t = 0; t < count; ++t) {
      for (int h = 0; h < view.num_kv_heads; ++h) {
        arena.codec_impl->Decode(
            std::span<const std::byte>(arena.Row(block, row + t, h), arena.unit_bytes),
            std::span<float>(rows.data() + (logical + t) * width + h * view.head_dim,
                             view.head_dim));
      }
    }
  });
  return rows;
}

absl::Status RunCalibrate(const CalibrateFlags& flags) {
  if (flags.max_windows < 1) return absl::InvalidArgumentError("--max-windows must be >= 1");
  if (flags.ctx < 2) return absl::InvalidArgumentError("--ctx must be >= 2");
  if (flags.heads) {
    return RunCalibrateHeads(flags.model, flags.file, flags.out, flags.ctx, flags.max_windows,
                             flags.engine.threads, flags.head_flags);
  }
  KVS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(flags.file, "text file"));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(flags.model));
  const std::vector<TokenId> tokens = model->tokenizer().Encode(text, /*add_bos=*/true);
  const int num_windows =
      std::min<int>(flags.max_windows, static_cast<int>(tokens.size() / flags.ctx));
  if (num_windows < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the text has %zu tokens, fewer than one window of --ctx %d", tokens.size(), flags.ctx));
  }
  EngineOptions options;
  options.kv.layout = LayoutKind::kContiguous;
  options.kv.k_codec = options.kv.v_codec = "f32";
  options.context_tokens = flags.ctx;
  options.num_threads = flags.engine.threads;
  options.max_batch = flags.engine.batch;
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*model, options));
  const LlamaHparams& hp = model->hparams();
  KvProfile profile(model->gguf().ContentHash(), hp.num_layers, hp.num_kv_heads, hp.head_dim);
  std::vector<float> logits;
  {
    ProgressBar bar("calibrate");
    for (int w = 0; w < num_windows; ++w) {
      std::vector<TokenId> window(tokens.begin() + static_cast<size_t>(w) * flags.ctx,
                                  tokens.begin() + static_cast<size_t>(w + 1) * flags.ctx);
      window[0] = model->tokenizer().bos_id();
      KVS_ASSIGN_OR_RETURN(SeqId seq, engine->NewSequence());
      KVS_RETURN_IF_ERROR(engine->Forward(seq, window, false, &logits));
      for (int l = 0; l < hp.num_layers; ++l) {
        const KvLayerView view = engine->cache().View(seq, l);
        profile.Accumulate(l, LayerRows(view, true), LayerRows(view, false));
      }
      profile.AddTokens(window.size());
      KVS_RETURN_IF_ERROR(engine->FreeSequence(seq));
      bar.Update(w + 1, num_windows);
    }
  }
  KVS_RETURN_IF_ERROR(profile.Finalize());
  KVS_RETURN_IF_ERROR(profile.Save(flags.out));

  std::printf("profile %s: %llu tokens, %d layers x %d kv heads, head_dim %d\n", flags.out.c_str(),
              static_cast<unsigned long long>(profile.tokens_seen()), hp.num_layers,
              hp.num_kv_heads, hp.head_dim);
  std::printf(
      "| layer | kind | energy at half rank, mean over heads | rank for 90%% | 95%% | "
      "99%% (max over heads) |\n|---|---|---|---|---|---|\n");
  // One row per layer and kind; `joint` is the [k; v] of the latent codecs, whose half rank is
  // head_dim.
  auto print_row = [&](int l, const char* kind, auto&& components) {
    double energy = 0;
    int r90 = 0, r95 = 0, r99 = 0;
    for (int h = 0; h < hp.num_kv_heads; ++h) {
      const HeadComponents& c = components(h);
      energy += c.EnergyRetained(static_cast<int>(c.eigenvalues.size()) / 2) / hp.num_kv_heads;
      r90 = std::max(r90, c.RankForEnergy(0.90));
      r95 = std::max(r95, c.RankForEnergy(0.95));
      r99 = std::max(r99, c.RankForEnergy(0.99));
    }
    std::printf("| %d | %s | %.4f | %d | %d | %d |\n", l, kind, energy, r90, r95, r99);
  };
  for (int l = 0; l < hp.num_layers; ++l) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      print_row(l, kind == KvKind::kKey ? "K" : "V",
                [&](int h) -> const HeadComponents& { return profile.components(l, h, kind); });
    }
    print_row(l, "K;V joint",
              [&](int h) -> const HeadComponents& { return profile.joint_components(l, h); });
  }
  return absl::OkStatus();
}

}  // namespace

RunFn RegisterCalibrate(CLI::App& app) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "Measure per-layer, per-kv-head PCA of keys and values on real text (low-rank and latent "
      "codecs), or with --heads how far back each head looks (policy duo)");
  sub->add_option("--model,-m", flags->model, "GGUF model file")->required();
  sub->add_option("--file,-f", flags->file, "text file")->required();
  sub->add_option("--out,-o", flags->out, "profile file to write")->required();
  sub->add_option("--ctx,-c", flags->ctx, "window length in tokens (default 512)");
  sub->add_option("--max-windows", flags->max_windows, "windows of text to use (default 16)");
  sub->add_flag("--heads", flags->heads,
                "write a head profile instead: per (layer, kv head) the attention mass outside "
                "the sinks and a recent window (DuoAttention's retrieval heads)");
  sub->add_option("--head-sinks", flags->head_flags.sink_tokens,
                  "--heads: sink tokens a streaming head keeps (default 4)");
  sub->add_option("--head-window", flags->head_flags.recent_tokens,
                  "--heads: recent tokens a streaming head keeps (default 64)");
  flags->engine.Add(sub);
  return [flags]() { return RunCalibrate(*flags); };
}

}  // namespace kvstack::cli
