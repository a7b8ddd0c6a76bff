#!/usr/bin/env bash
# The whole GPU check in one call, for a machine with one or more NVIDIA
# GPUs, nvcc, CMake, ninja, a C++17 compiler and PyTorch (with CUDA), but no
# package registry. It unpacks the .debs that tools/gpu-deps.sh fetched into a
# prefix, configures against PyTorch's libtorch, builds, runs the [cuda]
# tests, benchmarks training on the GPU at the issue's target shapes, the
# CUDA kernels' benchmarks, trains a 300-step quickstart on it, and runs the
# operator and routing tests, most telling first. Every log and JSON goes
# into one folder, with summary.txt listing each step's exit status and
# seconds.
#
#   tools/gpu-check.sh [--bundle] [OUT]     OUT: $OUT if set, else gpu-check-out/
#
# --bundle keeps the logs elsewhere and leaves exactly two files in OUT,
# summary.txt and gpu-check.tar.gz (every log and JSON), both refreshed after
# each step: for a machine that hands back only a few files, and whatever
# cuts the call short. CHIAR_GPU_STEPS=a,b runs only those steps after the
# build (a second call that finishes what a first one left).
#
# Carry .gpu-debs/ (tools/gpu-deps.sh, run on a Debian 12 machine) and
# .cache/sotu/corpus (tools/prepare-sotu.sh, here) with the tree. At most 8
# minutes on one H200 with 16 cores: CHIAR_GPU_BUDGET seconds in all
# (default 480), each step with its own time limit, cut to what is
# left of the budget, and a step that fails does not stop the later ones
# that can still run. Exit status: 0 when every step passed, 1 otherwise.
# Run again on the same machine, it keeps the unpacked prefix and the build
# folder: a build cut off at its limit goes on where it stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bundle=0
if [ "${1:-}" = "--bundle" ]; then bundle=1; shift; fi
dest=${1:-${OUT:-$root/gpu-check-out}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
out=$dest
[ $bundle -eq 0 ] || out=$(mktemp -d "${TMPDIR:-/tmp}/chiar-gpu-check.XXXXXX")
debs=${CHIAR_GPU_DEBS:-$root/.gpu-debs}
prefix=${CHIAR_GPU_PREFIX:-${TMPDIR:-/tmp}/chiar-gpu-prefix}
build=${CHIAR_GPU_BUILD:-$root/build-gpu}
python=${PYTHON:-python3}
summary=$out/summary.txt
: > "$summary"
failed=0
budget=${CHIAR_GPU_BUDGET:-480}
started=$SECONDS

# With --bundle: the logs so far into OUT, replacing the last bundle whole.
publish() {
  [ $bundle -eq 1 ] || return 0
  tar -czf "$dest/.gpu-check.tar.gz.part" -C "$out" . && mv "$dest/.gpu-check.tar.gz.part" "$dest/gpu-check.tar.gz"
  cp "$summary" "$dest/summary.txt"
}

# Whether CHIAR_GPU_STEPS (unset: every step) asks for step NAME.
wanted() { [ -z "${CHIAR_GPU_STEPS:-}" ] || [[ ",$CHIAR_GPU_STEPS," == *",$1,"* ]]; }

# step NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output
# in OUT/NAME.log, and records the outcome. The steps up to the build always
# run (they are quick when there is nothing to do); the others when wanted.
step() {
  local name=$1 limit=$2
  shift 2
  case $name in
    facts | unpack | configure | build) ;;
    *) wanted "$name" || { printf '%-16s not asked for (CHIAR_GPU_STEPS)\n' "$name" | tee -a "$summary"; return 0; } ;;
  esac
  local left=$((budget - (SECONDS - started)))
  if [ "$left" -lt 10 ]; then
    skip "$name" "the budget of ${budget}s is spent"
    return 1
  fi
  [ "$limit" -le "$left" ] || limit=$left
  local t0=$SECONDS
  # Through bash -c, so that COMMAND may be one of the functions below.
  timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "(stopped at the step's limit of ${limit}s)" >> "$out/$name.log"
  printf '%-16s rc %-3s %4s s  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$name.log" | tee -a "$summary"
  [ $rc -eq 0 ] || failed=1
  publish
  return $rc
}

skip() {
  printf '%-16s skipped: %s\n' "$1" "$2" | tee -a "$summary"
  failed=1
  publish
}

facts() {
  date -u
  uname -a
  nproc
  nvidia-smi || echo "nvidia-smi: not found"
  nvcc --version || echo "nvcc: not found"
  cmake --version | head -1
  ninja --version
  "${CXX:-c++}" --version | head -1
  # libtorch's CUDA libraries load their NVIDIA dependencies from the
  # wheel's neighbours; a missing one shows here before a link fails on it.
  "$python" - <<'EOF'
import glob, os, subprocess, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
for so in sorted(glob.glob(os.path.join(lib, "libtorch_cuda*.so"))):
    ldd = subprocess.run(["ldd", so], capture_output=True, text=True).stdout.splitlines()
    missing = [l.strip() for l in ldd if "not found" in l]
    print(os.path.basename(so), "resolves every library" if not missing else "misses: " + "; ".join(missing))
macros = os.path.join(os.path.dirname(torch.__file__), "include", "c10", "macros", "cmake_macros.h")
if os.path.exists(macros):
    print("libtorch built with glog:", "yes" if "#define C10_USE_GLOG" in open(macros).read() else "no")
EOF
  "$python" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)
print("cmake prefix", torch.utils.cmake_prefix_path)
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"device {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
EOF
}

# The .debs, checked against their sums, unpacked into the prefix without
# dpkg (the machine need not be Debian): ar + tar.
unpack() {
  [ -f "$debs/SHA256SUMS" ] || { echo "no $debs/SHA256SUMS: run tools/gpu-deps.sh and carry $debs"; return 2; }
  (cd "$debs" && sha256sum --check --quiet SHA256SUMS) || return 2
  # A second call on a warm machine (one that resumes a build cut off at
  # its limit) keeps the prefix, so nothing built against it is rebuilt.
  if cmp -s "$debs/SHA256SUMS" "$prefix/.unpacked"; then
    echo "already unpacked into $prefix"
    return 0
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local deb member
  for deb in "$debs"/*.deb; do
    member=$(ar t "$deb" | grep '^data\.tar') || { echo "$deb: no data member"; return 2; }
    case "$member" in
      *.xz) ar p "$deb" "$member" | tar -xJ -C "$prefix" ;;
      *.zst) ar p "$deb" "$member" | tar --zstd -x -C "$prefix" ;;
      *.gz) ar p "$deb" "$member" | tar -xz -C "$prefix" ;;
      *) ar p "$deb" "$member" | tar -x -C "$prefix" ;;
    esac || { echo "$deb: cannot unpack $member"; return 2; }
  done
  # Debian's development links may be absolute (zlib1g-dev: libz.so ->
  # /lib/x86_64-linux-gnu/libz.so.1...): point them into the prefix.
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    case "$target" in
      /*) if [ -e "$prefix$target" ]; then ln -sfn "$prefix$target" "$link";
          elif [ -e "$prefix/usr$target" ]; then ln -sfn "$prefix/usr$target" "$link"; fi ;;
    esac
  done < <(find "$prefix" -type l)
  cp "$debs/SHA256SUMS" "$prefix/.unpacked"
  echo "unpacked $(ls "$debs"/*.deb | wc -l) packages into $prefix"
}

configure() {
  local torch_prefix abi
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 2
  abi=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))') || return 2
  if [ "$abi" != 1 ]; then
    # Debian's Boost, TOML++ and sentencepiece use the C++11 string ABI;
    # a libtorch built with the old one cannot share std::string with them.
    echo "this PyTorch's libtorch uses the pre-C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=0); the Debian"
    echo "libraries use the C++11 one: use a PyTorch built with the C++11 ABI (pip wheels from 2.7 on)"
    return 2
  fi
  # The unpacked packages by their exact folders, so that a machine without
  # Debian's multiarch layout finds them too (and prefers them to its own).
  local lib=$prefix/usr/lib/x86_64-linux-gnu
  local hints=(
    -DBoost_DIR="$lib/cmake/Boost-1.74.0"
    -Dtomlplusplus_DIR="$lib/cmake/tomlplusplus"
    -Dbenchmark_DIR="$lib/cmake/benchmark"
    -DCLI11_DIR="$prefix/usr/share/cmake/CLI11"
    -DCatch2_DIR="$prefix/usr/lib/cmake/Catch2"
    -DSQLite3_INCLUDE_DIR="$prefix/usr/include"
    -DSQLite3_LIBRARY="$lib/libsqlite3.so"
    -DCMAKE_LIBRARY_PATH="$lib"
  )
  # The CUDA Toolkit by the nvcc on PATH (else /usr/local/cuda), named to
  # libtorch's CUDA configuration too, which otherwise may find another one;
  # the GPU's own architecture, so that it does not compile a probe to learn it.
  local nvcc cuda arch
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] || { echo "no nvcc on PATH or in /usr/local/cuda/bin"; return 2; }
  cuda=$(cd "$(dirname "$nvcc")/.." && pwd)
  # The harness's kernels link the toolkit's CUDA runtime, libtorch the one
  # it was built with; a process loads one libcudart per major version, so a
  # toolkit older than libtorch's CUDA can leave libtorch's symbols
  # unresolved, and one of another major version loads a second runtime.
  local nvcc_release torch_cuda
  nvcc_release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "none")')
  echo "CUDA Toolkit $nvcc_release ($nvcc); libtorch built with CUDA $torch_cuda"
  # Another major version, or an older toolkit of the same one.
  if [ "${nvcc_release%%.*}" != "${torch_cuda%%.*}" ] ||
     [ "$(printf '%s\n%s\n' "$nvcc_release" "$torch_cuda" | sort -V | head -1)" != "$torch_cuda" ]; then
    printf '%-16s warning: nvcc %s, libtorch CUDA %s: a failure to load or launch may come from the mismatch\n' \
      configure "$nvcc_release" "$torch_cuda" | tee -a "$summary"
  fi
  arch=$("$python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null || echo 9.0)
  # Torch's own prefix first: Gloo headers bundled with it match its c10d.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix/../..;$torch_prefix;$prefix/usr" \
    -DTorch_DIR="$torch_prefix/Torch" \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda" -DCUDA_TOOLKIT_ROOT_DIR="$cuda" \
    -DTORCH_CUDA_ARCH_LIST="$arch" \
    "${hints[@]}" \
    -DCHIAR_WITH_ONEDNN=OFF -DCHIAR_CUDA_TRAINING=ON \
    -DCMAKE_BUILD_RPATH="$lib"
}

export root debs prefix build python summary
export -f facts unpack configure
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "chiar gpu check: output in $dest" | tee -a "$summary"

step facts 60 facts
step unpack 60 unpack
if step configure 180 configure && step build 420 cmake --build "$build" -j "$(nproc)"; then
  tests=$build/chiar_tests
  chiar=$build/chiar
  # Which libtorch, CUDA runtime and OpenMP runtime(s) the binary loads: a
  # wheel's own libgomp beside the system's would be two thread pools.
  step linkage 20 ldd "$chiar"
  step tests-cuda 180 "$tests" "[cuda]" --reporter compact
  # The issue's two targets: the baseline's share of the bf16 GEMM rate at
  # B 16, T 2048, and DCT+Attn against the baseline at T 4096.
  step bench-large 240 "$chiar" bench-train --device cuda --variants baseline,chiar_dct_attn \
    --batch 16 --seq 2048 --d-model 512 --layers 4 --vocab 50257 --steps 10 --warmup 3 \
    --json "$out/bench-large.json"
  step bench-t4096 240 "$chiar" bench-train --device cuda --variants baseline,chiar_dct_attn \
    --batch 4 --seq 4096 --d-model 512 --layers 4 --vocab 50257 --steps 10 --warmup 3 \
    --json "$out/bench-t4096.json"
  # The same at T 4096 where attention does dominate the FLOPs: a byte-level
  # classifier, as LRA's text task. At the LM shape above the head's 2·d·V
  # caps DCT+Attn's FLOP saving at 1.17× (docs/performance.md, "GPU targets").
  step bench-t4096-text 150 "$chiar" bench-train --device cuda --variants baseline,chiar_dct_attn \
    --classes 2 --vocab 256 --batch 8 --seq 4096 --d-model 512 --layers 4 --steps 10 --warmup 3 \
    --json "$out/bench-t4096-text.json"
  # The CUDA kernels against the compositions they replace, and the sparse
  # layer's row moves against the layer (harness/src/bench/chiar_bench.cpp).
  step bench-kernels 180 "$build/chiar_bench" --benchmark_filter='^cuda/' --benchmark_min_time=0.1 \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/bench-kernels.json" --benchmark_out_format=json
  # The quickstart's matrix at 300 steps on the GPU, its store (not its
  # checkpoints) copied into OUT. Its corpus must be carried: building it
  # takes ./build/chiar and the npm package.
  if ! wanted quickstart-cuda; then
    step quickstart-cuda 0 true
  elif [ -f "$root/.cache/sotu/corpus/sotu.train.tokens" ]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/chiar-gpu-run.XXXXXX")
    step quickstart-cuda 300 "$chiar" run "$root/configs/quickstart.toml" --device cuda \
      --set train.steps=300 --db "$work/quickstart-cuda.db"
    cp "$work/quickstart-cuda.db" "$out/" 2>/dev/null && publish
  else
    skip quickstart-cuda "no .cache/sotu/corpus (run tools/prepare-sotu.sh here and carry it)"
  fi
  step bench-anchor 180 "$chiar" bench-train --device cuda --variants baseline,chiar_dct_attn \
    --json "$out/bench-anchor.json"
  step tests-ops 240 "$tests" "[operator],[routing]" --reporter compact
else
  skip tests "the build did not finish (configure.log, build.log)"
fi
echo "chiar gpu check: $([ $failed -eq 0 ] && echo "every step passed" || echo "some steps failed"); see $dest/summary.txt"
exit $failed
