// How the kvstack CLI's sub-commands plug into main: each file registers one sub-command on
// the app and returns the function to run when it is chosen. A sub-command returns a Status;
// main prints a failing one as a single line and exits 1.
#pragma once

#include <functional>

#include "CLI/CLI.hpp"
#include "kvstack/status.h"

namespace kvstack::cli {

using RunFn = std::function<absl::Status()>;

RunFn RegisterGenerate(CLI::App& app);
RunFn RegisterPerplexity(CLI::App& app);
RunFn RegisterInspect(CLI::App& app);
RunFn RegisterMakeModel(CLI::App& app);
RunFn RegisterBench(CLI::App& app);
RunFn RegisterSweep(CLI::App& app);
RunFn RegisterCalibrate(CLI::App& app);

}  // namespace kvstack::cli
