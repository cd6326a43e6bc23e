// A directory of the test process's own for the files a test writes (profiles, TOML, CLI
// output), so that test runs leave nothing behind: made on first use under gtest's temp dir and
// removed with everything in it when the process that made it exits normally. (A death test's
// forked child that exits does not remove it: only the creating process does.)
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace kvstack::testing_support {

inline const std::string& ScratchDir() {
  struct OwnDir {
    std::string path;
    pid_t owner = getpid();
    OwnDir() {
      std::string pattern = ::testing::TempDir() + "/kvstack_test_XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr) std::abort();
      path = pattern;
    }
    ~OwnDir() {
      if (getpid() != owner) return;
      std::error_code ignored;  // nothing to do about a file another process still holds
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const OwnDir dir;
  return dir.path;
}

}  // namespace kvstack::testing_support
