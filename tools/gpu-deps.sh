#!/usr/bin/env bash
# Downloads, as .debs, the Debian 12 packages the harness builds against
# beside libtorch, for tools/gpu-check.sh to unpack into a prefix on a GPU
# machine that has a compiler, CMake, ninja, nvcc and PyTorch but no package
# registry. Runs here (a Debian 12 machine with apt); writes DIR (default
# .gpu-debs, ignored by git) and DIR/SHA256SUMS.
#
#   tools/gpu-deps.sh [DIR]
#
# Left out on purpose: the compiler, libc and libstdc++ (the GPU machine's
# own), libtorch and oneDNN (PyTorch's, which gpu-check.sh builds against),
# and the run-time libraries of tools the check does not use (gnuplot,
# chromium, Slurm, clang).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu-debs}

packages=(
  libboost-dev libboost1.74-dev                     # Boost.DLL (headers)
  libboost-filesystem-dev libboost-filesystem1.74-dev libboost-filesystem1.74.0
  libboost-system1.74-dev libboost-system1.74.0     # Boost.Filesystem's dependency
  libtomlplusplus-dev libtomlplusplus3              # TOML matrices
  libsqlite3-dev libsqlite3-0                       # the results store
  libsentencepiece-dev libsentencepiece0            # subword tokenisers
  libcli11-dev                                      # command line (headers)
  catch2                                            # tests (headers)
  libbenchmark-dev libbenchmark1debian              # chiar_bench
  libgloo-dev                                       # Gloo's headers, for c10d's
  zlib1g-dev zlib1g                                 # checkpoint checksums
)

if ! apt-cache show "${packages[0]}" > /dev/null 2>&1; then
  echo "gpu-deps: apt knows no ${packages[0]}: run 'apt-get update' first" >&2
  exit 3
fi
mkdir -p "$out"
rm -f "$out"/*.deb "$out"/SHA256SUMS
# As root, apt would hand the download to its sandbox user, who cannot write here.
sandbox=()
[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)
(cd "$out" && apt-get download -q "${sandbox[@]}" "${packages[@]}")
(cd "$out" && sha256sum -- *.deb > SHA256SUMS)
count=$(ls "$out"/*.deb | wc -l)
size=$(du -sh "$out" | cut -f1)
echo "gpu-deps: $count packages, $size, in $out"
