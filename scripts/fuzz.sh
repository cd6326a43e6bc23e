#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer for a bounded time.
# Usage: scripts/fuzz.sh [seconds, default 60]
# Builds fuzz/gguf_fuzz.cc with clang++ (address + undefined sanitizers) in build-fuzz/, runs it
# on a scratch copy of fuzz/corpus/gguf (the checked-in corpus is not modified), and exits
# non-zero if the fuzzer finds a crash; the crashing input is left in build-fuzz/artifacts/.
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
jobs="${KVS_FUZZ_BUILD_JOBS:-2}"

# The fuzz target gets -fsanitize=fuzzer from CMakeLists.txt; the libraries it links need
# coverage instrumentation and the sanitizers too, or libFuzzer would be blind to the parser.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DKVS_FUZZ=ON -DKVS_BUILD_TESTS=OFF -DKVS_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  >/dev/null
cmake --build "$build" -j"$jobs" --target gguf_fuzz

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/fuzz/corpus/gguf" "$work/corpus"
mkdir -p "$build/artifacts"
# -rss_limit_mb: a parser that allocates from an unchecked count shows up as an OOM crash.
"$build/gguf_fuzz" "$work/corpus" -max_total_time="$seconds" -rss_limit_mb=2048 \
  -max_len=65536 -artifact_prefix="$build/artifacts/" -print_final_stats=1
