// Head calibration for DuoAttention-style head classes: how far back each (layer, kv head)
// looks on real text. A head's retrieval score is the mean, over the queries that have tokens
// between the sinks and the recent window, of the attention mass it puts there — what a
// streaming head (sinks + window) would lose. Heads with high scores are retrieval heads.
#pragma once

#include <span>

#include "kvstack/head_profile.h"
#include "kvstack/model.h"
#include "kvstack/status.h"

namespace kvstack {

struct HeadCalibrationOptions {
  int ctx = 512;           // window length in tokens; > sink_tokens + recent_tokens
  int max_windows = 4;     // windows of the text measured; >= 1
  int sink_tokens = 4;     // the streaming heads' sinks; >= 0
  int recent_tokens = 64;  // the streaming heads' recent window; >= 1
  int num_threads = 0;
};

// Runs the model over windows of `tokens` (BOS first), one token per forward call so every
// query is observed, with an F32 full cache. Errors: bad options, a text shorter than a window.
absl::StatusOr<HeadProfile> MeasureHeadProfile(const LlamaModel& model,
                                               std::span<const TokenId> tokens,
                                               const HeadCalibrationOptions& options);

}  // namespace kvstack
