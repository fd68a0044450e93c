#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and runs the whole test suite (CPU; GPU tests skip
# cleanly where no GPU exists).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
bash scripts/sanitize.sh
bash scripts/fuzz.sh short
