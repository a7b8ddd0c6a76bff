#!/usr/bin/env bash
# Every tracked C++ and CUDA source is as clang-format 14 (.clang-format) lays
# it out. Usage: check_format.sh SOURCE_DIR. Exit 77 (ctest: skipped) without
# clang-format-14 or outside a git checkout.
set -uo pipefail
src=$1
command -v clang-format-14 >/dev/null || { echo "SKIPPED: clang-format-14 is not installed (tools/install-deps.sh)"; exit 77; }
git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "SKIPPED: $src is not a git checkout"; exit 77; }
cd "$src" || exit 1
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if out=$(clang-format-14 --dry-run --Werror "${files[@]}" 2>&1); then
  echo "${#files[@]} files formatted"
  exit 0
fi
echo "$out" | grep -E ': (error|warning): ' | cut -d: -f1 | sort -u | sed 's/^/not formatted: /' | head -20
echo "FAILED: run clang-format-14 -i \$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')"
exit 1
