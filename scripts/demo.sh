#!/usr/bin/env bash
# Sets up, builds and runs the demo: greedy generation on the bundled stories260K model with
# the default cache configuration (paged, block 16, F16 keys and values).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build/release
model=../shared/models/stories260K.gguf
[ -f "$model" ] || { echo "demo: $model not found (clone kvstack beside shared/)" >&2; exit 1; }
./build/release/kvstack generate --model "$model" --prompt "Once upon a time" -n 200 "$@"
