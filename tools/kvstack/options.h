// Flags shared by the sub-commands: every cache option (layout, block size, codecs,
// capacity, sequences, policy, sinks, Hadamard keys, per-layer codecs, and a TOML file to
// start from), engine threads and batch, and the helpers every command needs (loading a
// model, printing a configuration, a progress bar).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "kvstack/engine.h"
#include "kvstack/kv_config.h"
#include "kvstack/model.h"
#include "nlohmann/json.hpp"
#include "selection_flags.h"

namespace kvstack::cli {

// The cache flags. A TOML file (--kv-config) gives the starting values; each flag given on
// the command line overrides its key (--layer-codec replaces the TOML table of its layer).
class CacheFlags {
 public:
  // with_grid_flags = false leaves --k-codec, --v-codec, --recent, --policy and --budget to the
  // command (sweep takes lists of them).
  void Add(CLI::App* app, bool with_grid_flags = true);
  absl::StatusOr<KvConfig> Resolve() const;

 private:
  std::string config_path_;
  std::string layout_, k_codec_, v_codec_, policy_;
  int block_size_ = 0;
  int64_t capacity_ = 0;
  int max_sequences_ = 0;
  int sink_tokens_ = 0;
  bool hadamard_keys_ = false;
  int recent_tokens_ = 0;
  CLI::Option* recent_tokens_opt_ = nullptr;
  std::string profile_;
  std::vector<std::string> layer_codecs_;
  std::vector<std::string> head_codecs_;
  CLI::Option* sink_tokens_opt_ = nullptr;
  CLI::Option* layout_opt_ = nullptr;
  CLI::Option* block_size_opt_ = nullptr;
  CLI::Option* k_codec_opt_ = nullptr;
  CLI::Option* v_codec_opt_ = nullptr;
  CLI::Option* capacity_opt_ = nullptr;
  CLI::Option* max_sequences_opt_ = nullptr;
  CLI::Option* policy_opt_ = nullptr;
  SelectionFlags selection_;
};

struct EngineFlags {
  int threads = 0;
  int batch = 512;
  void Add(CLI::App* app);
  // Whether --batch was given (commands whose default depends on the cache design ask).
  bool batch_given() const { return batch_opt_ != nullptr && batch_opt_->count() > 0; }

 private:
  CLI::Option* batch_opt_ = nullptr;
};

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const std::string& path);

// The whole file as bytes; NotFound naming `what` and the path when it cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);

// Parses one --layer-codec value "L:K:V" (layer index, key codec, value codec; K or V may be
// empty to keep the default). Codec names are checked later, with the whole configuration.
absl::StatusOr<KvConfig::LayerCodecs> ParseLayerCodec(std::string_view spec);
// Parses one --head-codec value, "L:H:K:V".
absl::StatusOr<KvConfig::HeadCodecs> ParseHeadCodec(std::string_view spec);

nlohmann::json KvConfigJson(const KvConfig& config);

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void Update(int done, int total);
  ~ProgressBar();

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace kvstack::cli
