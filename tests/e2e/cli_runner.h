// Running the real kvstack binary from a test: captures exit code, stdout and stderr. Each
// test process gets its own scratch directory (removed when it exits), because ctest runs tests
// in parallel processes and a shared /tmp file name would let one test read another's output.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "support/scratch_dir.h"

namespace kvstack::testing_cli {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using testing_support::ScratchDir;

// Runs `kvstack args` with `env` (e.g. "PATH=/x") in front of it.
inline CommandResult RunCli(const std::string& args, const std::string& env = "") {
  const std::string out = ScratchDir() + "/cli_out.txt";
  const std::string err = ScratchDir() + "/cli_err.txt";
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(KVS_CLI_PATH) +
                          " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = Slurp(out);
  result.err = Slurp(err);
  return result;
}

inline int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace kvstack::testing_cli
