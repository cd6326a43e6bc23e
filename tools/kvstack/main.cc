// kvstack: the command-line tool. Each sub-command lives in its own file and registers itself
// here; a failing command prints one line "kvstack: <message>" and exits 1. CLI11's own
// usage errors exit 2 (106 for --help style exits is CLI11's convention; we normalise).
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "command.h"

int main(int argc, char** argv) {
  CLI::App app{"kvstack: a KV-cache engine for LLM inference, with a CPU Llama engine"};
  app.require_subcommand(1);
  struct Entry {
    CLI::App* sub;
    kvstack::cli::RunFn run;
  };
  std::vector<Entry> entries;
  auto add = [&](kvstack::cli::RunFn (*reg)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    kvstack::cli::RunFn run = reg(app);
    entries.push_back({app.get_subcommands({})[before], std::move(run)});
  };
  add(kvstack::cli::RegisterGenerate);
  add(kvstack::cli::RegisterPerplexity);
  add(kvstack::cli::RegisterInspect);
  add(kvstack::cli::RegisterMakeModel);
  add(kvstack::cli::RegisterBench);
  add(kvstack::cli::RegisterSweep);
  add(kvstack::cli::RegisterCalibrate);
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const Entry& entry : entries) {
      known = known || entry.sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + entry.sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "kvstack: unknown command '%s'; commands: %s\n", argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "kvstack: %s\n", e.what());
    return 2;
  }
  for (const Entry& entry : entries) {
    if (!entry.sub->parsed()) continue;
    const absl::Status status = entry.run();
    if (!status.ok()) {
      std::fprintf(stderr, "kvstack: %s\n", std::string(status.message()).c_str());
      return 1;
    }
    return 0;
  }
  return 2;
}
