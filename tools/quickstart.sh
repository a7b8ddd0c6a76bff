#!/usr/bin/env bash
# The main job on embedded defaults: installs what is missing, builds, and
# shows the harness at work (runtime probe, plugins, the paper's variants,
# the tasks' data).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
./build/chiar info
./build/chiar plugins
for plan in "attn,attn,attn,attn" "dct,dct|attn,dct|attn,attn" "dct,dct|rbf|attn,dct|rbf|attn,attn"; do
  ./build/chiar model --layers "$plan" --batch 4 --seq 256
done
tools/prepare-sotu.sh
for task in sotu listops_flat; do
  ./build/chiar data stats configs/tasks.toml --table "tasks.$task"
done
