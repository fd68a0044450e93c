#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (GCC), in build-asan/.
#   bash scripts/sanitize.sh            configure, build, run `ctest -L cpu`
#   bash scripts/sanitize.sh -R Packed  extra arguments go to ctest
# Any ASan, LSan or UBSan report aborts the process, so the test that hit it fails. Leaks in
# third-party libraries are suppressed in scripts/lsan.supp (one commented entry each); our own
# code is never suppressed. Tests that spawn `vitrain` run the sanitized binary (and it inherits
# the options below from the environment).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVIT_CUDA=OFF \
  -DVIT_NATIVE=ON -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" >/dev/null
cmake --build build-asan -j "$(nproc)"

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export LSAN_OPTIONS="suppressions=$ROOT/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
start=$(date +%s)
# No test sets a timeout of its own; --timeout only stops a hung test from blocking CI.
ctest --test-dir build-asan -L cpu --output-on-failure -j "$(nproc)" --timeout 1800 "$@"
echo "sanitize: CPU suite under ASan+UBSan passed in $(($(date +%s) - start)) s"
