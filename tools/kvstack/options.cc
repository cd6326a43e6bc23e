// The cache and engine flags shared by generate, perplexity, bench and sweep, so that every
// cache option is spelled the same way everywhere and maps onto exactly one KvConfig key.
#include "options.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace kvstack::cli {

void CacheFlags::Add(CLI::App* app, bool with_grid_flags) {
  app->add_option("--kv-config", config_path_,
                  "TOML file with the cache configuration (flags override its keys)");
  layout_opt_ = app->add_option("--layout", layout_, "contiguous | paged | ring (default paged)");
  block_size_opt_ = app->add_option(
      "--block-size", block_size_,
      "tokens per block, paged layout (default 0: 16, or a multiple of the codecs' token "
      "units, e.g. 32 for kivi2)");
  if (with_grid_flags) {
    k_codec_opt_ = app->add_option(
        "--k-codec", k_codec_, "key storage codec, e.g. f16, int8, int4-g32, kivi2 (default f16)");
    v_codec_opt_ = app->add_option("--v-codec", v_codec_,
                                   "value storage codec, e.g. f16, int8, int4 (default f16)");
  }
  capacity_opt_ = app->add_option(
      "--capacity", capacity_,
      "token slots per sequence (ring length for ring); 0 = what the run needs (default 0)");
  max_sequences_opt_ =
      app->add_option("--max-sequences", max_sequences_, "sequences held at once (default 1)");
  if (with_grid_flags) {
    policy_opt_ = app->add_option(
        "--policy", policy_,
        "selection policy: full | window | streaming | h2o | tova | snapkv | duo (default full)");
  }
  selection_.Add(app, with_grid_flags);
  sink_tokens_opt_ = app->add_option(
      "--sinks", sink_tokens_,
      "first S tokens of every sequence kept in F32 whatever the codecs (default 0)");
  if (with_grid_flags) {
    recent_tokens_opt_ = app->add_option(
        "--recent", recent_tokens_,
        "most recent tokens kept in F32 before they are encoded (KIVI's residual; default 0)");
  }
  app->add_flag("--hadamard-keys", hadamard_keys_,
                "rotate keys by a Hadamard matrix before encoding (default off)");
  app->add_option(
      "--profile", profile_,
      "calibration profile for low-rank and latent codecs (kvstack calibrate writes one)");
  app->add_option("--layer-codec", layer_codecs_,
                  "L:K:V codecs of layer L (K or V empty keeps the default); repeatable")
      ->take_all()
      ->allow_extra_args(false);
  app->add_option("--head-codec", head_codecs_,
                  "L:H:K:V codecs of kv head H of layer L (K or V empty keeps the layer's); "
                  "repeatable")
      ->take_all()
      ->allow_extra_args(false);
}

absl::StatusOr<KvConfig::LayerCodecs> ParseLayerCodec(std::string_view spec) {
  // absl::string_view is its own type in this absl build, not std::string_view.
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(spec.data(), spec.size()), ':');
  int layer_idx = -1;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &layer_idx) || layer_idx < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--layer-codec '%s': expected L:K:V (layer index >= 0, key codec, value codec; K or V "
        "may be empty to keep the default), e.g. 0:f32:f16 or 3::int8",
        spec));
  }
  return KvConfig::LayerCodecs{.layer_idx = layer_idx,
                               .k_codec = std::string(parts[1]),
                               .v_codec = std::string(parts[2]),
                               .policy = ""};
}

absl::StatusOr<KvConfig::HeadCodecs> ParseHeadCodec(std::string_view spec) {
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(spec.data(), spec.size()), ':');
  int layer_idx = -1, kv_head = -1;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &layer_idx) || layer_idx < 0 ||
      !absl::SimpleAtoi(parts[1], &kv_head) || kv_head < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--head-codec '%s': expected L:H:K:V (layer index >= 0, kv head index >= 0, key codec, "
        "value codec; K or V may be empty to keep the layer's), e.g. 0:1:int8:int4 or 2:0:int8:",
        spec));
  }
  return KvConfig::HeadCodecs{.layer_idx = layer_idx,
                              .kv_head = kv_head,
                              .k_codec = std::string(parts[2]),
                              .v_codec = std::string(parts[3])};
}

absl::StatusOr<KvConfig> CacheFlags::Resolve() const {
  KvConfig config;
  if (!config_path_.empty()) {
    KVS_ASSIGN_OR_RETURN(config, LoadKvConfigFile(config_path_));
  }
  if (layout_opt_->count() > 0) {
    KVS_ASSIGN_OR_RETURN(config.layout, ParseLayout(layout_));
  }
  if (block_size_opt_->count() > 0) config.block_size = block_size_;
  if (k_codec_opt_ != nullptr && k_codec_opt_->count() > 0) config.k_codec = k_codec_;
  if (v_codec_opt_ != nullptr && v_codec_opt_->count() > 0) config.v_codec = v_codec_;
  if (capacity_opt_->count() > 0) config.capacity = capacity_;
  if (max_sequences_opt_->count() > 0) config.max_sequences = max_sequences_;
  if (policy_opt_ != nullptr && policy_opt_->count() > 0) config.policy = policy_;
  if (sink_tokens_opt_->count() > 0) config.sink_tokens = sink_tokens_;
  if (hadamard_keys_) config.hadamard_keys = true;
  if (recent_tokens_opt_ != nullptr && recent_tokens_opt_->count() > 0) {
    config.recent_tokens = recent_tokens_;
  }
  if (!profile_.empty()) config.profile = profile_;
  for (const std::string& spec : layer_codecs_) {
    KVS_ASSIGN_OR_RETURN(KvConfig::LayerCodecs layer, ParseLayerCodec(spec));
    auto same_layer = [&](const KvConfig::LayerCodecs& l) {
      return l.layer_idx == layer.layer_idx;
    };
    std::erase_if(config.layer_codecs, same_layer);
    config.layer_codecs.push_back(std::move(layer));
  }
  for (const std::string& spec : head_codecs_) {
    KVS_ASSIGN_OR_RETURN(KvConfig::HeadCodecs head, ParseHeadCodec(spec));
    std::erase_if(config.head_codecs, [&](const KvConfig::HeadCodecs& h) {
      return h.layer_idx == head.layer_idx && h.kv_head == head.kv_head;
    });
    config.head_codecs.push_back(std::move(head));
  }
  KVS_RETURN_IF_ERROR(selection_.Apply(&config));
  KVS_RETURN_IF_ERROR(ValidateKvConfig(config));
  return config;
}

void EngineFlags::Add(CLI::App* app) {
  app->add_option("--threads", threads, "kernel threads, 0 = all cores (default 0)");
  batch_opt_ = app->add_option(
      "--batch", batch,
      "tokens per forward pass (default 512; perplexity and sweep: the window, or 16 when the "
      "cache evicts; sweep: 16 for every row when any configuration evicts)");
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("--model is required");
  return LlamaModel::Load(path);
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open %s '%s'", what, path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json KvConfigJson(const KvConfig& config) {
  nlohmann::json layers = nlohmann::json::array();
  for (const KvConfig::LayerCodecs& layer : config.layer_codecs) {
    layers.push_back({{"layer_idx", layer.layer_idx},
                      {"k_codec", layer.k_codec},
                      {"v_codec", layer.v_codec},
                      {"policy", layer.policy}});
  }
  nlohmann::json heads = nlohmann::json::array();
  for (const KvConfig::HeadCodecs& head : config.head_codecs) {
    heads.push_back({{"layer_idx", head.layer_idx},
                     {"kv_head", head.kv_head},
                     {"k_codec", head.k_codec},
                     {"v_codec", head.v_codec}});
  }
  return nlohmann::json{{"layout", std::string(LayoutName(config.layout))},
                        {"block_size", config.block_size},
                        {"k_codec", config.k_codec},
                        {"v_codec", config.v_codec},
                        {"capacity", config.capacity},
                        {"max_sequences", config.max_sequences},
                        {"policy", config.policy},
                        {"sink_tokens", config.sink_tokens},
                        {"hadamard_keys", config.hadamard_keys},
                        {"recent_tokens", config.recent_tokens},
                        {"profile", config.profile},
                        {"budget", config.budget.ToString()},
                        {"layer_budget", config.layer_budget},
                        {"head_budget", config.head_budget},
                        {"evict_step", config.evict_step},
                        {"policy_sinks", config.policy_sinks},
                        {"policy_recent", config.policy_recent},
                        {"observation_window", config.observation_window},
                        {"pool_kernel", config.pool_kernel},
                        {"score_aggregation", config.score_aggregation},
                        {"positions", config.positions},
                        {"head_profile", config.head_profile},
                        {"retrieval_fraction", config.retrieval_fraction},
                        {"layer_codecs", layers},
                        {"head_codecs", heads}};
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), enabled_(isatty(STDERR_FILENO) == 1) {}

void ProgressBar::Update(int done, int total) {
  if (!enabled_ || total <= 0) return;
  constexpr int kWidth = 40;
  const int filled = static_cast<int>(static_cast<int64_t>(kWidth) * done / total);
  std::fprintf(stderr, "\r%s [%s%s] %d/%d", label_.c_str(), std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '.').c_str(), done, total);
  std::fflush(stderr);
  drawn_ = true;
}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\n");
}

}  // namespace kvstack::cli
