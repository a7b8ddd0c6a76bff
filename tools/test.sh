#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test. CI calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
# Every ctest entry (docs/building.md#tests), two at a time: the long scaffold
# entry then overlaps the others (engine runs alone), and each test process
# runs two threads. An entry that could not run here is listed as "Skipped"
# with the reason in its output (ctest -V, or build/Testing/Temporary/LastTest.log).
ctest --test-dir build --output-on-failure -j2
# Every fuzz corpus and crash reproducer once (docs/fuzzing.md), under a
# minute; says "SKIPPED" with the reason where clang's libFuzzer is missing.
tools/fuzz.sh regress
