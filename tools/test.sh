#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test. CI calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
ctest --test-dir build --output-on-failure
