#!/usr/bin/env bash
# Installs the Debian 12 packages chiar-harness needs, only those missing.
# Idempotent: with everything present it runs no apt-get at all.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev          # libtorch 1.13 (CPU)
  libdnnl-dev           # oneDNN's sgemm for the model's products (libtorch links libdnnl already)
  libgloo-dev           # Gloo's headers, for libtorch's c10d process group (engine/cluster/process_group.cpp)
  libopenblas0-openmp   # fast BLAS; without it libtorch runs ~15x slower
  libblas3              # the reference BLAS, used by a test that checks detection
  libboost-dev libboost-filesystem-dev  # Boost.DLL plugin loading
  libtomlplusplus-dev   # TOML matrices
  libsqlite3-dev sqlite3                # the results store
  catch2                # tests (v2)
  libbenchmark-dev      # operator benchmarks
  libsentencepiece-dev  # subword tokeniser
  libcli11-dev          # command line
  gnuplot-nox           # report charts
  chromium              # the report test renders the HTML headless
  clang libclang-rt-14-dev  # libFuzzer, ASan and UBSan for tools/fuzz.sh (docs/fuzzing.md)
  clang-format-14       # the source layout (.clang-format), checked by the ctest entry `format`
  slurm-wlm munge       # a local one-node Slurm for the `slurm` test (tools/slurm-local.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "installing: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
