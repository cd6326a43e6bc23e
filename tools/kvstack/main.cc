// kvstack: the command-line tool. Each sub-command lives in its own file and registers itself
// here; a failing command prints one line "kvstack: <message>" and exits non-zero.
#include <cstdio>

#include "CLI/CLI.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvstack: a KV-cache engine for LLM inference"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
