#!/usr/bin/env bash
# Fault campaign (issue 17): kill -9 at random moments of training and inside checkpoint writes,
# a checkpoint write past the file-size limit (EFBIG) and on a full file system (ENOSPC), and
# data files truncated or corrupted mid-run. Every case must leave the previous checkpoint
# loadable, resume to the uninterrupted run's loss curve and final weights (bitwise, CPU), or
# end with one clear error line. Results: a table on stdout and in $OUT/results.md.
#   bash scripts/fault_campaign.sh [KILLS]     (default 50; needs build/vitrain and python3)
# Environment: VITRAIN (binary, default build/vitrain), OUT (results folder, default a temp dir),
# THREADS (per run, default 2).
set -uo pipefail
cd "$(dirname "$0")/.."
KILLS="${1:-50}"
VITRAIN="$(realpath "${VITRAIN:-build/vitrain}")"
OUT="${OUT:-$(mktemp -d /tmp/vitrain-faults.XXXXXX)}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/vitrain-faults-work.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
[ -x "$VITRAIN" ] || { echo "fault_campaign: no binary at $VITRAIN (run scripts/build.sh)" >&2; exit 2; }
UTIL="$(dirname "$0")/fault_campaign_util.py"
py() { /usr/bin/python3 "$UTIL" "$@"; }  # Debian's python (PIL), as the tests use
RESULTS="$OUT/results.md"
: >"$RESULTS"
pass=0
fail=0
record() {  # record <case> <PASS|FAIL|SKIP> <detail>
  printf '| %s | %s | %s |\n' "$1" "$2" "$3" | tee -a "$RESULTS"
  case "$2" in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; esac
}

py toy-idx "$WORK/idx" 1024 256 || exit 2
FLAGS=(--data-dir "$WORK/idx" --model vit_fmnist_tiny --img-size 8 -b 32 --epochs 6 --lr 2e-3
  --warmup-epochs 1 --log-interval 1 -j "${THREADS:-2}" --seed 5 --hflip 0 --crop-pad 0
  --output "$WORK/runs")
train() { "$VITRAIN" train "${FLAGS[@]}" "$@"; }
# Every checkpoint in a run folder loads (export reads weights files and the training state,
# checking every tensor against the model the file describes; no data needed).
all_loadable() {
  local f
  for f in "$1"/*.safetensors; do
    [ -e "$f" ] || continue
    rm -rf "$WORK/export"
    "$VITRAIN" export --checkpoint "$f" --out "$WORK/export" >/dev/null 2>&1 || return 1
  done
}

echo "| case | result | detail |" | tee -a "$RESULTS"
echo "|---|---|---|" | tee -a "$RESULTS"

# --- the uninterrupted reference run ------------------------------------------------------------
t0=$(date +%s%N)
train --experiment ref >"$WORK/ref.out" 2>&1 || { echo "reference run failed" >&2; exit 1; }
ref_ms=$((($(date +%s%N) - t0) / 1000000))
record "reference run" PASS "$ref_ms ms, $(grep -c '"type":"train"' "$WORK/runs/ref/log.jsonl") updates"

# --- kill -9: half at random moments, half as soon as a checkpoint temp file appears -------------
resume_matches() {  # <run>: resume to the end; same losses and final weights as the reference,
  # and no temp file of an interrupted write left in the folder
  "$VITRAIN" train --resume "$WORK/runs/$1" >"$WORK/$1.resume" 2>&1 || return 1
  ! compgen -G "$WORK/runs/$1/*.tmp.*" >/dev/null || return 1
  py same-run "$WORK/runs/ref" "$WORK/runs/$1"
}
for i in $(seq 1 "$KILLS"); do
  run="kill$i"
  "$VITRAIN" train "${FLAGS[@]}" --experiment "$run" >"$WORK/$run.out" 2>&1 &  # (not via a
  pid=$!  # function: kill -9 must reach vitrain itself, not a subshell)
  hit="random"
  if [ $((i % 2)) -eq 0 ]; then
    # In a write: once the first checkpoint exists, poll for the atomic writer's temp file
    # (<name>.tmp.<pid>) and kill at once.
    deadline=$(($(date +%s%N) + ref_ms * 2000000))
    while kill -0 "$pid" 2>/dev/null; do
      if [ -e "$WORK/runs/$run/state.safetensors" ] && compgen -G "$WORK/runs/$run/*.tmp.*" >/dev/null; then
        kill -9 "$pid" 2>/dev/null
        hit="in a write"
        break
      fi
      [ "$(date +%s%N)" -gt "$deadline" ] && break
      sleep 0.002
    done
    [ "$hit" = "in a write" ] || hit="no write caught: not killed"
  else
    # At a random moment after the first checkpoint (earlier kills have nothing to resume).
    py wait-for "$WORK/runs/$run/state.safetensors" 60
    sleep "$(/usr/bin/python3 -c "import random; random.seed($i); print(round(random.uniform(0, $ref_ms / 1500), 2))")"
    kill -9 "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  status=$?
  if [ ! -e "$WORK/runs/$run/state.safetensors" ]; then
    # Killed before the first checkpoint: nothing to resume; a fresh start must still work.
    rm -rf "$WORK/runs/$run"
    if train --experiment "$run" >"$WORK/$run.out" 2>&1 && py same-run "$WORK/runs/ref" "$WORK/runs/$run"; then
      record "kill -9 #$i ($hit)" PASS "before the first checkpoint; a fresh run matches"
    else
      record "kill -9 #$i ($hit)" FAIL "no checkpoint, and a fresh run failed"
    fi
    continue
  fi
  leftovers=$(compgen -G "$WORK/runs/$run/*.tmp.*" | wc -l)
  killed_at=$(py state-step "$WORK/runs/$run")
  if ! all_loadable "$WORK/runs/$run"; then
    record "kill -9 #$i ($hit)" FAIL "a checkpoint does not load (exit $status)"
  elif resume_matches "$run"; then
    step=$(py state-step "$WORK/runs/$run")
    record "kill -9 #$i ($hit)" PASS "exit $status, checkpoint at step $killed_at; loadable ($leftovers temp file(s) left, removed by the resume); resumed to the same losses and weights (step $step)"
  else
    record "kill -9 #$i ($hit)" FAIL "resume differs or failed: $(tail -1 "$WORK/$run.resume")"
  fi
  rm -rf "$WORK/runs/$run"
done

# --- a checkpoint write past the file-size limit (EFBIG) -----------------------------------------
one_error_line() {  # <stderr file>: exactly one line, starting "error:"
  [ "$(wc -l <"$1")" -eq 1 ] && head -c 6 "$1" | grep -q '^error:'
}
train --experiment efbig --stop-after-updates 80 >/dev/null 2>&1
before=$(sha256sum "$WORK/runs/efbig/state.safetensors" | cut -d' ' -f1)
size_kib=$(($(stat -c %s "$WORK/runs/efbig/state.safetensors") / 1024))
(ulimit -f $((size_kib / 2)) && "$VITRAIN" train --resume "$WORK/runs/efbig" >/dev/null 2>"$WORK/efbig.err")
status=$?
after=$(sha256sum "$WORK/runs/efbig/state.safetensors" | cut -d' ' -f1)
if [ $status -eq 1 ] && one_error_line "$WORK/efbig.err" && [ "$before" = "$after" ] &&
  resume_matches efbig; then
  record "checkpoint write past ulimit -f" PASS "exit 1: $(cut -c1-110 "$WORK/efbig.err"); state unchanged; resumed to the same run"
else
  record "checkpoint write past ulimit -f" FAIL "exit $status: $(head -c 200 "$WORK/efbig.err")"
fi

# --- a checkpoint write on a full file system (ENOSPC): a small tmpfs, where mounting works -----
mnt="$WORK/tmpfs"
mkdir -p "$mnt"
train --experiment enospc --stop-after-updates 80 >/dev/null 2>&1
# Room for the run folder and half a state file more: the next checkpoint cannot fit.
room_kib=$(($(du -sk "$WORK/runs/enospc" | cut -f1) + $(stat -c %s "$WORK/runs/enospc/state.safetensors") / 2048 + 64))
if mount -t tmpfs -o size=${room_kib}k tmpfs "$mnt" 2>/dev/null; then
  cp -r "$WORK/runs/enospc" "$mnt/enospc"
  before=$(sha256sum "$mnt/enospc/state.safetensors" | cut -d' ' -f1)
  "$VITRAIN" train --resume "$mnt/enospc" >/dev/null 2>"$WORK/enospc.err"
  status=$?
  after=$(sha256sum "$mnt/enospc/state.safetensors" | cut -d' ' -f1)
  cp -r "$mnt/enospc/." "$WORK/runs/enospc/"
  umount "$mnt"
  if [ $status -eq 1 ] && one_error_line "$WORK/enospc.err" && [ "$before" = "$after" ] &&
    resume_matches enospc; then
    record "checkpoint write on a full file system" PASS "exit 1: $(cut -c1-110 "$WORK/enospc.err"); state unchanged; resumed to the same run"
  else
    record "checkpoint write on a full file system" FAIL "exit $status: $(head -c 200 "$WORK/enospc.err")"
  fi
else
  record "checkpoint write on a full file system" SKIP "cannot mount a tmpfs here (needs root); run as root"
fi

# --- data truncated or corrupted mid-run ---------------------------------------------------------
py image-folder "$WORK/folder" 600 100 || exit 2
"$VITRAIN" prepare --data-dir "$WORK/folder" --out "$WORK/packed" >/dev/null 2>&1 || exit 2
PFLAGS=(--model vit_fmnist_tiny --img-size 16 -b 32 --epochs 6 --log-interval 1 -j 2 --seed 5
  --output "$WORK/runs")
cp "$WORK/packed/train.vitpack" "$WORK/train.vitpack.orig"
"$VITRAIN" train --data-dir "$WORK/packed" "${PFLAGS[@]}" --experiment packed >/dev/null 2>"$WORK/packed.err" &
pid=$!
py wait-for "$WORK/runs/packed/state.safetensors" 60
py truncate-file "$WORK/packed/train.vitpack"
wait "$pid"
status=$?
cp "$WORK/train.vitpack.orig" "$WORK/packed/train.vitpack"
if [ $status -eq 1 ] && one_error_line "$WORK/packed.err" && all_loadable "$WORK/runs/packed" &&
  "$VITRAIN" train --resume "$WORK/runs/packed" >/dev/null 2>&1; then
  record "packed data truncated mid-run" PASS "exit 1: $(cut -c1-110 "$WORK/packed.err"); checkpoints load; resumed once restored"
else
  record "packed data truncated mid-run" FAIL "exit $status: $(head -c 200 "$WORK/packed.err")"
fi

"$VITRAIN" train --data-dir "$WORK/folder" "${PFLAGS[@]}" --experiment folder >"$WORK/folder.out" 2>&1 &
pid=$!
py wait-for "$WORK/runs/folder/state.safetensors" 60
py corrupt-images "$WORK/folder/train" 25
wait "$pid"
status=$?
skipped=$(grep -o 'Skipped [0-9]* unreadable images' "$WORK/folder.out")
if [ $status -eq 0 ] && [ -n "$skipped" ]; then
  record "image-folder files corrupted mid-run" PASS "exit 0, training went on: $skipped"
else
  record "image-folder files corrupted mid-run" FAIL "exit $status: $(tail -2 "$WORK/folder.out")"
fi

train --experiment idx --stop-after-updates 80 >/dev/null 2>&1
py truncate-file "$WORK/idx/train-images-idx3-ubyte.gz"
"$VITRAIN" train --resume "$WORK/runs/idx" >/dev/null 2>"$WORK/idx.err"
status=$?
if [ $status -eq 1 ] && one_error_line "$WORK/idx.err" && all_loadable "$WORK/runs/idx"; then
  record "IDX data truncated before a resume" PASS "exit 1: $(cut -c1-110 "$WORK/idx.err"); checkpoints load"
else
  record "IDX data truncated before a resume" FAIL "exit $status: $(head -c 200 "$WORK/idx.err")"
fi

echo
echo "fault campaign: $pass passed, $fail failed ($RESULTS)"
[ "$fail" -eq 0 ]
