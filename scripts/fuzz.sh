#!/usr/bin/env bash
# The libFuzzer targets of fuzz/ (one per parser of outside input), built with clang, ASan and
# UBSan in build-fuzz/, and run from the seed corpus in fuzz/corpus/<target>/.
#   bash scripts/fuzz.sh build                    configure and build only
#   bash scripts/fuzz.sh short [SECONDS]          every target for SECONDS (default 10): CI
#   bash scripts/fuzz.sh campaign N [TARGET...]   every (or each named) target to N executions,
#                                                 FUZZ_LANES (default 1) targets at a time, each
#                                                 stopping early after FUZZ_SECONDS if set (a
#                                                 segment: the next one goes on from the corpus);
#                                                 rows appended to build-fuzz/campaign.md
#   bash scripts/fuzz.sh run TARGET [ARGS...]     one target with your own libFuzzer arguments
#   bash scripts/fuzz.sh corpus                   rewrite fuzz/corpus/ with fuzz/make_corpus.cpp
# Inputs the fuzzer finds go to build-fuzz/corpus/<target>/ (never into the repo); a crashing,
# leaking, hanging or memory-hungry input is saved as build-fuzz/artifacts/<target>-<kind>-<hash>
# and fails the run. Reproduce one with: build-fuzz/fuzz/fuzz_<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(safetensors idx npy cifar packed config class_map jpeg png)
BIN=build-fuzz/fuzz
# Per input: 25 s is a hang, 2 GiB (RSS, or one malloc) is a runaway allocation.
FUZZ_FLAGS=(-timeout=25 -rss_limit_mb=2048 -print_final_stats=1)
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

build() {
  cmake -S . -B build-fuzz -G Ninja -DVIT_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-fuzz -j "$(nproc)"
}

# run_target TARGET LOG [libFuzzer args...]: returns libFuzzer's exit status.
run_target() {
  local t=$1 log=$2
  shift 2
  mkdir -p "build-fuzz/corpus/$t" build-fuzz/artifacts
  "$BIN/fuzz_$t" "build-fuzz/corpus/$t" "fuzz/corpus/$t" "${FUZZ_FLAGS[@]}" \
    -artifact_prefix="build-fuzz/artifacts/$t-" "$@" >"$log" 2>&1
}

stat_of() {  # stat_of LOG NAME: a value of libFuzzer's final stats
  sed -n "s/^stat::$2: *//p" "$1" | tail -1
}

# campaign_target TARGET RUNS TABLE: one target to RUNS executions; appends its row to TABLE
# (crashes 1 on a finding).
campaign_target() {
  local t=$1 runs=$2 table=$3 log="build-fuzz/campaign-$1.log" start secs execs corpus crashes=0
  start=$(date +%s)
  run_target "$t" "$log" -runs="$runs" ${FUZZ_SECONDS:+-max_total_time="$FUZZ_SECONDS"} ||
    crashes=1
  secs=$(($(date +%s) - start))
  execs=$(stat_of "$log" number_of_executed_units)
  corpus=$(find "build-fuzz/corpus/$t" "fuzz/corpus/$t" -type f | wc -l)
  echo "| $t | ${execs:-?} | $secs | $(stat_of "$log" average_exec_per_sec) | $crashes | $corpus |" |
    tee -a "$table"
}

mode="${1:-short}"
case "$mode" in
  build)
    build
    ;;
  short)
    secs="${2:-10}"
    build
    failed=()
    for t in "${TARGETS[@]}"; do
      log="build-fuzz/short-$t.log"
      if run_target "$t" "$log" -max_total_time="$secs"; then
        echo "fuzz $t: $(stat_of "$log" number_of_executed_units) runs," \
          "$(stat_of "$log" average_exec_per_sec)/s, ok"
      else
        echo "fuzz $t: FAILED (log: $log)"
        tail -n 40 "$log"
        failed+=("$t")
      fi
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
      exit 1
    fi
    ;;
  campaign)
    runs="${2:?usage: fuzz.sh campaign N [TARGET...]}"
    shift 2
    [ $# -gt 0 ] && TARGETS=("$@")
    build
    table=build-fuzz/campaign.md
    mkdir -p build-fuzz
    commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src fuzz || echo '+changes')"
    lanes="${FUZZ_LANES:-1}"
    # Segments append their tables, so a campaign run in several sessions keeps its history.
    prev=0
    if [ -f "$table" ]; then prev=$(wc -l <"$table"); fi
    first_row=$((prev + 5 + (prev > 0)))
    # A campaign keeps no allocation stacks (ASan's malloc stack unwinding was ~22% of
    # fuzz_config's time): a finding still aborts and saves its input; replay it with
    # build-fuzz/fuzz/fuzz_<target> FILE for the full report.
    export ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=0}"
    {
      [ "$prev" -eq 0 ] || echo
      echo "Campaign $(date -u +%Y-%m-%d), commit $commit, $(nproc) cores, $lanes target(s) at a" \
        "time, $runs runs per target${FUZZ_SECONDS:+ or $FUZZ_SECONDS s}, ASAN_OPTIONS=$ASAN_OPTIONS"
      echo
      echo "| target | executions | seconds | exec/s | crashes | corpus |"
      echo "|---|---:|---:|---:|---:|---:|"
    } >>"$table"
    for t in "${TARGETS[@]}"; do
      # FUZZ_LANES targets run at once (one core each); wait for a lane before the next.
      while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n || true; done
      campaign_target "$t" "$runs" "$table" &
    done
    wait
    echo "fuzz: table in $table"
    # A finding, or a target without its row, fails the campaign.
    rows=$(awk -v f="$first_row" 'NR >= f' "$table" | wc -l)
    crashed=$(awk -F'|' -v f="$first_row" 'NR >= f && $6 + 0 != 0' "$table" | wc -l)
    [ "$rows" -eq "${#TARGETS[@]}" ] && [ "$crashed" -eq 0 ]
    ;;
  run)
    t="${2:?usage: fuzz.sh run TARGET [ARGS...]}"
    shift 2
    mkdir -p "build-fuzz/corpus/$t" build-fuzz/artifacts
    exec "$BIN/fuzz_$t" "build-fuzz/corpus/$t" "fuzz/corpus/$t" "${FUZZ_FLAGS[@]}" \
      -artifact_prefix="build-fuzz/artifacts/$t-" "$@"
    ;;
  corpus)
    build
    "$BIN/make_corpus" fuzz/corpus
    du -sh fuzz/corpus
    ;;
  *)
    echo "usage: fuzz.sh build | short [SECONDS] | campaign N [TARGET...] | run TARGET [ARGS...]" \
      "| corpus" >&2
    exit 2
    ;;
esac
