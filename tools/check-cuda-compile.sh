#!/usr/bin/env bash
# Compiles the harness's CUDA code on a machine without a GPU or a CUDA
# libtorch: nvcc builds every harness/cuda/*.cu for the architectures the
# build targets (sm_80, sm_90), with warnings as errors, and the host
# compiler checks the C++ that only a CUDA build compiles (the tensor
# wrappers, the CHIAR_CUDA_KERNELS branches of the files that call them, the
# GPU memory records, the queue marks) against this machine's libtorch
# headers and the CUDA Toolkit's. An optional check, not a CI step: the CUDA Toolkit is not in
# Debian's main.
#
#   tools/check-cuda-compile.sh            # uses $NVCC, else nvcc on PATH or in /usr/local/cuda
#   tools/check-cuda-compile.sh --install  # first installs Debian's nvidia-cuda-toolkit (non-free; root)
#
# TORCH_INCLUDE names libtorch's include folder (default: Debian's, /usr/include).
# Exit status: 0 when everything compiled, 1 when something did not, 2 when
# there is no nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

install_debian_toolkit() {
  # Debian 12 ships the toolkit in non-free, which the machine's sources may
  # not list: a private source list adds it for this one install.
  local apt=${TMPDIR:-/tmp}/chiar-apt-non-free
  mkdir -p "$apt/lists" "$apt/cache"
  echo "deb http://deb.debian.org/debian bookworm main contrib non-free" > "$apt/sources.list"
  local opts=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache")
  apt-get "${opts[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq --no-install-recommends nvidia-cuda-toolkit
}

[ "${1:-}" = "--install" ] && install_debian_toolkit

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  for candidate in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc /usr/bin/nvcc; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then nvcc=$candidate; break; fi
  done
fi
if [ -z "$nvcc" ]; then
  echo "check-cuda-compile: no nvcc found (set NVCC, or run with --install for Debian's nvidia-cuda-toolkit)" >&2
  exit 2
fi
release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
echo "nvcc $release: $nvcc"

# CUDA 11's nvcc refuses a GCC newer than 11 (Debian 12 has 12): it names
# the host compilers it takes; use one of those that is installed.
ccbin=()
if [ "${release%%.*}" -lt 12 ] && [ "$(g++ -dumpversion | cut -d. -f1)" -gt 11 ]; then
  for host in g++-11 clang++-14 clang-14; do
    if command -v "$host" > /dev/null; then ccbin=(-ccbin "$host"); break; fi
  done
  [ ${#ccbin[@]} -gt 0 ] || { echo "check-cuda-compile: nvcc $release needs g++-11 or clang-14" >&2; exit 2; }
  echo "host compiler for nvcc: ${ccbin[1]}"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/chiar-cuda-compile.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0

for source in harness/cuda/*.cu; do
  if "$nvcc" "${ccbin[@]}" -std=c++17 -O2 \
       -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
       -Werror all-warnings -Xcompiler -Wall,-Wextra \
       -c "$source" -o "$work/$(basename "$source").o"; then
    echo "compiled  $source (sm_80, sm_90)"
  else
    echo "FAILED    $source"; failed=1
  fi
done

# The host side, as a CUDA build compiles it: its build facts say it has the
# kernels, and CUDA libtorch's one generated c10 header, absent from a CPU
# libtorch, is supplied with the value CUDA builds give it.
mkdir -p "$work/generated" "$work/shim/c10/cuda/impl"
sed -e 's/@CMAKE_BUILD_TYPE@/Release/' -e 's/@PROJECT_VERSION@/0/' -e 's/@CHIAR_HAVE_ONEDNN@/0/' \
    -e 's/@CHIAR_CUDA_TRAINING@/1/' -e 's/@CHIAR_CUDA_KERNELS@/1/' -e 's/@CHIAR_TORCH_CUDA@/1/' \
    harness/src/core/build_info.h.in > "$work/generated/chiar_build_info.h"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$work/shim/c10/cuda/impl/cuda_cmake_macros.h"
torch_include=${TORCH_INCLUDE:-/usr/include}
cuda_include=$(cd "$(dirname "$nvcc")/../include" && pwd)
includes=(-I harness/include -I harness/src -I harness/src/core -I harness/cuda -I "$work/generated"
          -isystem "$torch_include/torch/csrc/api/include" -isystem "$work/shim")
[ "$torch_include" = /usr/include ] || includes+=(-isystem "$torch_include")
[ "$cuda_include" = /usr/include ] || includes+=(-isystem "$cuda_include")
for source in harness/src/core/cuda_routing.cpp harness/src/core/cuda_head.cpp harness/src/core/chunked_cross_entropy.cpp \
              harness/src/core/spectral.cpp harness/src/core/rows.cpp \
              harness/src/core/kernels.cpp harness/src/bench/chiar_bench.cpp harness/src/engine/runtime/gpu_memory.cpp \
              harness/src/engine/runtime/queue_mark.cpp; do
  if g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -fopenmp "${includes[@]}" "$source"; then
    echo "checked   $source (as a CUDA build compiles it)"
  else
    echo "FAILED    $source"; failed=1
  fi
done
[ $failed -eq 0 ] && echo "check-cuda-compile: everything compiled" || echo "check-cuda-compile: some sources failed"
exit $failed
