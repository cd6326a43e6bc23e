#!/usr/bin/env bash
# Compiles every C++ source (library, CLI, tests, benchmarks) with clang++ at -O0, objects
# discarded, and exits non-zero on the first error. The builds run g++; this keeps the tree
# building with Debian's clang as well, whose rules differ where the kernels live: a
# function's target attribute replaces Highway's per-target pragma instead of adding to it, and
# __builtin_cpu_supports knows fewer feature names. About 80 s on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
jobs="$(nproc)"
# The path macros only need to be defined: nothing runs.
git ls-files '*.cc' | grep -v '^fuzz/' | xargs -P"$jobs" -I{} sh -c \
  'clang++ -std=gnu++20 -Iinclude -Isrc -Itools -Itests -O0 -DKVS_CLI_PATH=\"\" \
     -DKVS_SHARED_DIR=\"\" -DKVS_SOURCE_DIR=\"\" -c "$1" -o /dev/null || exit 255' _ {}
