#!/usr/bin/env bash
# Configures (once) and builds the harness in build/ (Release unless BUILD_TYPE
# says otherwise): every target, or the targets named (tools/build.sh
# chiar_runtime: the CLI and its plugins only). Fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_type=${BUILD_TYPE:-Release}
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >/dev/null
fi
cmake --build build -j "$(nproc)" ${1:+--target "$@"}
