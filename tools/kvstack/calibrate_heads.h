// `kvstack calibrate --heads`: measures DuoAttention-style head classes (run/head_calibration.h)
// and writes a head profile for policy "duo".
#pragma once

#include <string>

#include "kvstack/status.h"

namespace kvstack::cli {

struct CalibrateHeadsFlags {
  int sink_tokens = 4;     // --head-sinks
  int recent_tokens = 64;  // --head-window
};

absl::Status RunCalibrateHeads(const std::string& model_path, const std::string& file,
                               const std::string& out, int ctx, int max_windows, int threads,
                               const CalibrateHeadsFlags& flags);

}  // namespace kvstack::cli
