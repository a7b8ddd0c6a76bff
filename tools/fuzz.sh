#!/usr/bin/env bash
# libFuzzer targets for the harness's readers (docs/fuzzing.md), built with
# clang, ASan and UBSan in build-fuzz/.
#   tools/fuzz.sh build              configure (once) and build every target
#   tools/fuzz.sh regress            every checked-in corpus and crash input once (CI, < 60 s)
#   tools/fuzz.sh run TARGET SECONDS fuzz one target; new inputs go to build-fuzz/corpus/TARGET,
#                                    crashes to tests/fuzz/crashes/TARGET/
#   tools/fuzz.sh all SECONDS        every target in turn, SECONDS each (the long session)
#   tools/fuzz.sh list               the targets
# Environment: FUZZ_JOBS (default 2) for the build; extra libFuzzer flags in FUZZ_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(matrix listops vectors imdb wikitext checkpoint plugin_descriptor)
build_dir=build-fuzz
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Leaks inside libtorch itself (tests/fuzz/lsan.supp says which and why).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}

# The longest input each target starts from: files, not bulk data, are what
# the readers parse; the checkpoint target needs room for a whole archive.
max_len() {
  case "$1" in
    checkpoint) echo 65536 ;;
    matrix | wikitext) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

# Why the fuzz targets cannot be built here, or nothing when they can.
missing_toolchain() {
  command -v clang++ >/dev/null || { echo "clang++ not found (tools/install-deps.sh installs clang)"; return; }
  local rt
  rt=$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
  [ -f "$rt" ] || echo "libFuzzer not found (tools/install-deps.sh installs libclang-rt-14-dev)"
}

build() {
  local why
  why=$(missing_toolchain)
  if [ -n "$why" ]; then echo "fuzz: cannot build: $why" >&2; return 1; fi
  if [ ! -f "$build_dir/build.ninja" ]; then
    cmake -S tests/fuzz -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ >/dev/null
  fi
  cmake --build "$build_dir" -j "${FUZZ_JOBS:-2}"
}

check_target() {
  local t
  for t in "${targets[@]}"; do [ "$t" = "$1" ] && return 0; done
  echo "fuzz: unknown target '$1' (known: ${targets[*]})" >&2
  exit 2
}

# Every seed and every checked-in crash reproducer, once: a reproducer of a
# fixed bug must keep passing.
regress() {
  local why
  why=$(missing_toolchain)
  if [ -n "$why" ]; then
    echo "fuzz regression: SKIPPED: $why"
    return 0
  fi
  build >/dev/null
  local start=$SECONDS t files
  for t in "${targets[@]}"; do
    mapfile -t files < <(find "tests/fuzz/corpus/$t" "tests/fuzz/crashes/$t" -type f 2>/dev/null | sort)
    if [ ${#files[@]} -eq 0 ]; then
      echo "fuzz regression: $t: no inputs"
      continue
    fi
    if ! "$build_dir/fuzz_$t" -timeout=20 "${files[@]}" >"$build_dir/regress-$t.log" 2>&1; then
      tail -40 "$build_dir/regress-$t.log" >&2
      echo "fuzz regression: $t: FAILED (log: $build_dir/regress-$t.log)" >&2
      return 1
    fi
    echo "fuzz regression: $t: ${#files[@]} inputs passed"
  done
  echo "fuzz regression: every corpus passed in $((SECONDS - start)) s"
}

run() {
  local t=$1 seconds=$2
  check_target "$t"
  build >/dev/null
  mkdir -p "$build_dir/corpus/$t" "tests/fuzz/crashes/$t"
  # New inputs go to the first folder (scratch); the checked-in seeds are only read.
  # shellcheck disable=SC2086
  "$build_dir/fuzz_$t" "$build_dir/corpus/$t" "tests/fuzz/corpus/$t" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len="$(max_len "$t")" \
    -print_final_stats=1 -artifact_prefix="tests/fuzz/crashes/$t/" ${FUZZ_FLAGS:-}
}

case "${1:-}" in
  build) build ;;
  regress) regress ;;
  run)
    [ $# -eq 3 ] || { echo "usage: tools/fuzz.sh run TARGET SECONDS" >&2; exit 2; }
    run "$2" "$3" ;;
  all)
    [ $# -eq 2 ] || { echo "usage: tools/fuzz.sh all SECONDS" >&2; exit 2; }
    for t in "${targets[@]}"; do run "$t" "$2"; done ;;
  list) printf '%s\n' "${targets[@]}" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
