#!/usr/bin/env bash
# Installs what vitrain needs on Debian 12 (run as root, or with sudo available).
#   bash scripts/setup.sh train   what building and training need (no Python, no test stack)
#   bash scripts/setup.sh         that plus the tests' stack (GoogleTest, PyTorch, ...)
# Idempotent: apt is only called when a package is missing.
set -euo pipefail
MODE="${1:-test}"
case "$MODE" in train | test) ;; *) echo "usage: setup.sh [train|test]" >&2; exit 2 ;; esac
PACKAGES=(
  cmake ninja-build g++ pkg-config
  libopenblas-openmp-dev                         # our BLAS (OpenMP flavour)
  zlib1g-dev libpng-dev libjpeg62-turbo-dev libfftw3-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  dataset-fashion-mnist                          # the default recipe's data
)
if [ "$MODE" = test ]; then
  PACKAGES+=(
    libgtest-dev libbenchmark-dev
    libopenblas0-pthread                         # PyTorch's BLAS (pthread flavour)
    python3 python3-numpy python3-torch          # the reference implementation for the tests
    python3-pil python3-torchvision              # reference for the augmentation tests
    python3-skimage                              # photos for bench/compare_data.sh
    clang libclang-rt-14-dev                     # libFuzzer + sanitizers (scripts/fuzz.sh)
    libopenmpi-dev openmpi-bin                   # data parallel on the CPU (mpirun tests)
  )
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# PyTorch finds BLAS through Debian's alternative: point it at OpenBLAS (pthread), never the
# reference BLAS, which is an order of magnitude slower.
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
  target=/usr/lib/x86_64-linux-gnu/openblas-pthread/${alt%%-x86_64-linux-gnu}
  if update-alternatives --list "$alt" 2>/dev/null | grep -qx "$target"; then
    $SUDO update-alternatives --set "$alt" "$target" >/dev/null
  fi
done
