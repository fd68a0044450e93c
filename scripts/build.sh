#!/usr/bin/env bash
# Configures and builds vitrain into build/ (Release). Extra arguments go to `cmake --build`
# (scripts/train.sh passes `--target vitrain` to skip the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" "$@"
