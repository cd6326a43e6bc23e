#!/usr/bin/env bash
# Configures and builds one kvstack build tree: scripts/build.sh DIR [extra cmake args...].
# Uses every core; reconfigures only when the tree is new.
set -euo pipefail
dir=$1
shift
cd "$(dirname "$0")/.."
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
fi
cmake --build "$dir" -j"$(nproc)" 2>&1 | grep -E "error|warning|Error" || true
cmake --build "$dir" -j"$(nproc)" >/dev/null
