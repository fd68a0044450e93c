#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and trains the quick default recipe on
# Fashion-MNIST (Debian's dataset-fashion-mnist); prints the final test accuracy.
# Extra arguments go to `vitrain train` (e.g. --epochs 6 for the full recipe).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh train
bash scripts/build.sh --target vitrain
./build/vitrain train -c recipes/fmnist_quick.yaml "$@"
