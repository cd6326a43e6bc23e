#!/usr/bin/env bash
# Sets up, builds and runs every test: a clang compile of every source (the builds use g++),
# the Release suite, the same suite under AddressSanitizer + UndefinedBehaviorSanitizer, and a
# bounded libFuzzer run of the GGUF reader. Exits non-zero on the first failure. FUZZ_SECONDS
# (default 60) bounds the fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

echo "== format check" >&2
files=$(git ls-files '*.cc' '*.h')
if ! clang-format --dry-run --Werror $files 2>/dev/null; then
  echo "clang-format: these files are not formatted (run clang-format -i):" >&2
  clang-format --dry-run $files 2>&1 | grep -o '^[^:]*\.\(cc\|h\)' | sort -u >&2
  exit 1
fi

echo "== clang compile check" >&2
bash scripts/clang_check.sh

echo "== release build and tests" >&2
bash scripts/build.sh build/release
ctest --test-dir build/release --output-on-failure -j"$jobs"

echo "== address+undefined sanitizer build and tests" >&2
# -O1 with line tables only (-g1): what the sanitizers need for checks and symbolised stack
# traces. -O2 -g took 17 of CI's 36 min on 2 Zen 4 cores to build (7.4 min for
# attention_decode.cc alone, its kernels instantiated for five SIMD targets); -O1 -g1 builds it
# 2.7x faster. KVS_SIMD_HOST_ONLY leaves out the targets this CPU cannot run (the tests run
# every one it can): on an AVX2-only Zen 3, attention_decode.cc builds in 1.9 min instead of 3.7.
bash scripts/build.sh build/asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DKVS_SANITIZE=address,undefined -DKVS_BUILD_BENCH=OFF -DKVS_SIMD_HOST_ONLY=ON
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j"$jobs"

echo "== fuzzing the GGUF reader for ${FUZZ_SECONDS:-60} s" >&2
bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
echo "all tests passed" >&2
