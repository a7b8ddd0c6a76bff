#!/usr/bin/env bash
# The main job on embedded defaults: installs what is missing, builds, prepares
# the State of the Union corpus, and runs the quickstart matrix (the five paper
# variants on flat ListOps and on State of the Union byte-level language
# modelling, 3 seeds) into results/quickstart.db, then prints the results. A second run
# finds every run finished and ends in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh chiar_runtime   # the tests and benchmarks are tools/test.sh's
tools/prepare-sotu.sh
./build/chiar run configs/quickstart.toml
./build/chiar show results/quickstart.db
