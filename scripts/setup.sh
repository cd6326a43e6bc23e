#!/usr/bin/env bash
# Installs every Debian package kvstack's build, tests and tools need.
# Idempotent: when everything is present it prints nothing and exits 0.
set -euo pipefail

packages=(
  cmake g++ make pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libabsl-dev libhwy-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libxxhash-dev liburing-dev libhiredis-dev redis-server libcpp-httplib-dev
  clang libclang-rt-14-dev gnuplot
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq >/dev/null
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
