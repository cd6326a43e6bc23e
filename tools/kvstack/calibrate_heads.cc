// `kvstack calibrate --heads`: the head profile, written and summarised per layer.
#include "calibrate_heads.h"

#include <cstdio>

#include "options.h"
#include "run/head_calibration.h"

namespace kvstack::cli {

absl::Status RunCalibrateHeads(const std::string& model_path, const std::string& file,
                               const std::string& out, int ctx, int max_windows, int threads,
                               const CalibrateHeadsFlags& flags) {
  KVS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(file, "text file"));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(model_path));
  const std::vector<TokenId> tokens = model->tokenizer().Encode(text, /*add_bos=*/true);
  HeadCalibrationOptions options;
  options.ctx = ctx;
  options.max_windows = max_windows;
  options.sink_tokens = flags.sink_tokens;
  options.recent_tokens = flags.recent_tokens;
  options.num_threads = threads;
  KVS_ASSIGN_OR_RETURN(const HeadProfile profile, MeasureHeadProfile(*model, tokens, options));
  KVS_RETURN_IF_ERROR(profile.Save(out));
  std::printf(
      "head profile %s: attention mass outside %d sinks + %d recent tokens, per layer and kv "
      "head (high = retrieval head)\n",
      out.c_str(), flags.sink_tokens, flags.recent_tokens);
  for (int layer = 0; layer < profile.num_layers(); ++layer) {
    std::printf("layer %d:", layer);
    for (int h = 0; h < profile.num_kv_heads(); ++h) {
      std::printf(" %.3f", profile.score(layer, h));
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

}  // namespace kvstack::cli
