#!/usr/bin/env bash
# The ImageNet recipe's rehearsal at ImageNet's shape (docs/rehearsal.md): generates an
# ImageNet-like folder (bench/make_imagenet_like.py), measures `vitrain prepare` (rate per core,
# peak RSS) and training start-up (index + class map + first batch: time and RSS), kills
# prepare and training with SIGKILL at random moments and checks that everything recovers
# (counts, labels, a sha256 per record, losses and EMA bit for bit), and writes
# OUT/results.json plus OUT/log.txt.
#
#   bash bench/imagenet_rehearsal.sh docs/runs/imagenet_rehearsal_<name>
# Environment: N (training files, 100000), NVAL (5000), SCALE (image size factor, 1),
# FULL (full-size files for the prepare rate, 2000), KILLS (10), J (threads, 2),
# WORK (/tmp/imagenet_rehearsal: the big data; never inside the repository),
# COMMIT (what results.json names: HEAD), VITRAIN (build/vitrain), PY (/usr/bin/python3),
# TRAIN_EPOCHS (2), TRAIN_N (training files of the killed training runs' folder: N, or fewer
# where a CPU cannot train N in the time), PARTS (below).
set -euo pipefail
OUT=${1:?usage: imagenet_rehearsal.sh OUT_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-100000} NVAL=${NVAL:-5000} SCALE=${SCALE:-1} FULL=${FULL:-2000} KILLS=${KILLS:-10}
J=${J:-2} WORK=${WORK:-/tmp/imagenet_rehearsal} VITRAIN=${VITRAIN:-$SRC/build/vitrain}
PY=${PY:-/usr/bin/python3} TRAIN_EPOCHS=${TRAIN_EPOCHS:-2} TRAIN_N=${TRAIN_N:-$N}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
RES=$WORK/results.txt  # key=value lines, turned into results.json at the end
mkdir -p "$WORK"
# PARTS: which parts run (default all: data startup prepare kills training); a partial list keeps
# the other parts' figures and log from an earlier run (results.txt and log.txt are appended to).
PARTS=${PARTS:-all}
part() { [ "$PARTS" = all ] || [[ " $PARTS " == *" $1 "* ]]; }
if [ "$PARTS" = all ]; then
  : > "$LOG"
  : > "$RES"
fi
say() { echo "$*" | tee -a "$LOG"; }
put() { echo "$1=$2" >> "$RES"; }
fail() { say "FAIL: $*"; exit 1; }
CHECK="$PY $SRC/tests/rehearsal_check.py"
# /usr/bin/time -v's fields: wall seconds, peak RSS (KiB), user + system CPU seconds.
tv() { # tv NAME CMD...: runs CMD under /usr/bin/time -v, puts NAME_{wall,rss_mib,cpu}
  local name=$1
  shift
  /usr/bin/time -v -o "$WORK/$name.time" "$@"
  record "$name"
}
record() { # record NAME: puts NAME's figures from WORK/NAME.time
  local name=$1 wall rss cpu
  wall=$(awk -F': ' '/Elapsed \(wall/ {n = split($2, t, ":"); s = 0;
    for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s}' "$WORK/$name.time")
  rss=$(awk -F': ' '/Maximum resident/ {printf "%.1f", $2 / 1024}' "$WORK/$name.time")
  cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.2f", s}' "$WORK/$name.time")
  put "${name}_wall_s" "$wall"
  put "${name}_rss_mib" "$rss"
  put "${name}_cpu_s" "$cpu"
  say "$name: ${wall}s wall, ${cpu}s CPU, peak RSS ${rss} MiB (load $(cut -d' ' -f1-3 /proc/loadavg))"
}
count_files() { awk -F'\t' -v s="$2" 'NR > 1 && $1 == s' "$1/manifest.tsv" | wc -l; }

say "rehearsal: N=$N NVAL=$NVAL SCALE=$SCALE FULL=$FULL KILLS=$KILLS J=$J WORK=$WORK"
say "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
put commit "${COMMIT:-$(git -C "$SRC" rev-parse --short HEAD)}"
put load_at_start "$(cut -d' ' -f1-3 /proc/loadavg)"

PREP=(prepare --max-side 256 --format jpeg --quality 90 -j "$J")  # the recipe's preparation
# 1. The data sets: the big one, a small one (the start-up baseline), full-size files (the rate).
D=$WORK/data
if part data; then
if [ ! -e "$D/manifest.tsv" ]; then
  rm -rf "$D"
  tv generate "$PY" "$SRC/bench/make_imagenet_like.py" --out "$D" --train "$N" --val "$NVAL" \
    --scale "$SCALE" -j "$J"
else  # made earlier by the same command, its time -v file beside it
  record generate
fi
[ -e "$WORK/small/manifest.tsv" ] || "$PY" "$SRC/bench/make_imagenet_like.py" \
  --out "$WORK/small" --train 1000 --val 100 --scale "$SCALE" -j "$J" > /dev/null
[ -e "$WORK/full/manifest.tsv" ] || "$PY" "$SRC/bench/make_imagenet_like.py" \
  --out "$WORK/full" --train "$FULL" --val 100 --seed 1 -j "$J" > /dev/null
put train_files "$(count_files "$D" train)"
put val_files "$(count_files "$D" val)"
put data_mib "$(du -sm "$D" | cut -f1)"
fi

# 2. Training start-up: indexing alone (prepare both splits into a path that is a file: it indexes,
# then stops with one error line), three times each, the small folder's taken off the big one's.
if part index; then
touch "$WORK/not_a_folder"
for r in 1 2 3; do
  for set in small data; do
    /usr/bin/time -f "%e %M" -o "$WORK/index.time" "$VITRAIN" prepare --data-dir "$WORK/$set" \
      --out "$WORK/not_a_folder" > /dev/null 2>&1 || true
    read -r wall kib < <(tail -1 "$WORK/index.time")  # after "Command exited with ... 1"
    say "index $set (try $r): ${wall}s, peak RSS $((kib / 1024)) MiB"
    echo "$set $wall $kib" >> "$WORK/index.tries"
  done
done
put index_small_files "$(awk -F'\t' 'NR > 1' "$WORK/small/manifest.tsv" | wc -l)"
put index_big_files "$(awk -F'\t' 'NR > 1' "$D/manifest.tsv" | wc -l)"
put index_tries "$(tail -6 "$WORK/index.tries" | tr '\n' ';')"
fi

# 2b. Training start-up as a whole: index both splits, the class map, one batch of 8 at 224 px.
if part startup; then
STARTUP=(bench-data --img-size 224 -b 8 --batches 1 -j "$J")
tv startup_small "$VITRAIN" "${STARTUP[@]}" --data-dir "$WORK/small" > /dev/null
tv startup_big "$VITRAIN" "${STARTUP[@]}" --data-dir "$D" > /dev/null
fi

if part prepare; then
# 3. prepare: the reference packs, their rate and peak RSS; full-size files for the rate too.
rm -rf "$WORK/ref" "$WORK/full_pack"
tv prepare_full "$VITRAIN" "${PREP[@]}" --data-dir "$WORK/full" --out "$WORK/full_pack" \
  2> "$WORK/prepare_full.err" | tee -a "$LOG"
put prepare_full_records "$(sed -n 's/.*: \([0-9]*\) train + \([0-9]*\) val images.*/\1 \2/p' "$LOG" |
  tail -1 | awk '{print $1 + $2}')"
tv prepare "$VITRAIN" "${PREP[@]}" --data-dir "$D" --out "$WORK/ref" 2> "$WORK/prepare.err" |
  tee -a "$LOG"
put prepare_warnings "$(grep -c '^warning: skipping' "$WORK/prepare.err")"
for s in train val; do
  $CHECK "$WORK/ref/$s.vitpack" "$D/manifest.tsv" $s 256 --sums "$WORK/ref_$s.sums" |
    tee -a "$LOG" | grep -q '"ok": true' || fail "reference $s pack does not match the folder"
done
put prepare_records "$(cat "$WORK"/ref_*.sums | wc -l)"
fi

if part kills; then
# 4. prepare killed KILLS times at random moments, each re-run starting over (it removes the dead
# run's temp file); after each kill, any pack in place must be whole; the last re-run finishes
# and every record's sha256 is the reference's.
ref_wall=$(awk -F= '$1 == "prepare_wall_s" {print $2}' "$RES")
rm -rf "$WORK/pk"
removed=0 whole_in_place=0
for k in $(seq "$KILLS"); do
  delay=$("$PY" -c "import random; random.seed($k); print(round(random.uniform(0.05, 0.95) * $ref_wall, 2))")
  "$VITRAIN" "${PREP[@]}" --data-dir "$D" --out "$WORK/pk" > /dev/null 2> "$WORK/pk.err" &
  pid=$!
  sleep "$delay"
  kill -9 $pid 2> /dev/null || true
  wait $pid 2> /dev/null || true
  grep -q "removed 1 temp file" "$WORK/pk.err" && removed=$((removed + 1))
  for s in train val; do
    if [ -e "$WORK/pk/$s.vitpack" ]; then
      $CHECK "$WORK/pk/$s.vitpack" "$D/manifest.tsv" $s 256 --ref "$WORK/ref/$s.vitpack" \
        > /dev/null || fail "kill $k left a bad $s.vitpack"
      whole_in_place=$((whole_in_place + 1))
    fi
  done
  say "prepare kill $k at ${delay}s: temp files $(ls "$WORK/pk" 2> /dev/null | grep -c tmp || true)"
done
"$VITRAIN" "${PREP[@]}" --data-dir "$D" --out "$WORK/pk" > /dev/null 2> "$WORK/pk.err"
grep -q "removed 1 temp file" "$WORK/pk.err" && removed=$((removed + 1))
! compgen -G "$WORK/pk/*.tmp.*" > /dev/null || fail "temp files left after the re-run"
for s in train val; do
  $CHECK "$WORK/pk/$s.vitpack" "$D/manifest.tsv" $s 256 --ref "$WORK/ref/$s.vitpack" |
    tee -a "$LOG" | grep -q '"ok": true' || fail "re-run $s pack differs from the reference"
done
put prepare_kills "$KILLS"
put prepare_dead_temp_files_removed "$removed"
put prepare_whole_packs_seen_after_kills "$whole_in_place"
fi

if part training; then
# 5. The recipe with CPU overrides on a pack, uninterrupted, then killed KILLS times at random
# moments and resumed each time; the losses and the final weights (raw and EMA) must be the
# uninterrupted run's, bit for bit.
if [ "$TRAIN_N" = "$N" ]; then
  TD=$WORK/ref
else
  TD=$WORK/train_pack
  if [ ! -e "$TD/train.vitpack" ]; then
    rm -rf "$WORK/train_data"
    "$PY" "$SRC/bench/make_imagenet_like.py" --out "$WORK/train_data" --train "$TRAIN_N" \
      --val $((TRAIN_N / 10)) --scale "$SCALE" -j "$J" --seed 2 > /dev/null
    "$VITRAIN" "${PREP[@]}" --data-dir "$WORK/train_data" --out "$TD" > /dev/null 2>&1
  fi
fi
put train_run_files "$TRAIN_N"
TRAIN=("$VITRAIN" train -c "$SRC/recipes/imagenet_vit_s_24h.yaml" --data-dir "$TD"
  --model vit_tiny_patch4_32 --img-size 32 --device cpu --precision fp32 -b 64
  --budget "" --epochs "$TRAIN_EPOCHS" -j "$J" --log-interval 1 --output "$WORK/runs")
rm -rf "$WORK/runs"
tv train_ref "${TRAIN[@]}" --experiment ref > "$WORK/train_ref.out" 2> "$WORK/train_ref.err"
grep -E "stage|Test|Epoch" "$WORK/train_ref.out" | tail -20 >> "$LOG" || true
ref_wall=$(awk -F= '$1 == "train_ref_wall_s" {print $2}' "$RES")
# Checkpoints are written at epoch ends: each kill waits for a new one (so the run progresses),
# then strikes a random moment into the next epoch (up to 3 s), or inside a checkpoint write.
ST=$WORK/runs/killed/state.safetensors
mtime() { stat -c %Y.%y "$ST" 2> /dev/null || echo none; }
"${TRAIN[@]}" --experiment killed > /dev/null 2>&1 &
pid=$!
for k in $(seq "$KILLS"); do
  before=$(mtime)
  while [ "$(mtime)" = "$before" ] && kill -0 $pid 2> /dev/null; do sleep 0.05; done
  delay=$("$PY" -c "import random; random.seed(100 + $k); print(round(random.uniform(0, 3), 2))")
  sleep "$delay"
  kill -9 $pid 2> /dev/null || say "training kill $k came after the run ended"
  wait $pid 2> /dev/null || true
  step=$("$PY" -c "import json,sys; print(max([json.loads(l)['step'] for l in open(sys.argv[1]) if '\"train\"' in l] or [0]))" "$WORK/runs/killed/log.jsonl")
  say "training kill $k, ${delay}s after a checkpoint: logged up to step $step; resuming"
  "$VITRAIN" train --resume "$WORK/runs/killed" > "$WORK/resume.out" 2>> "$WORK/resume.err" &
  pid=$!
done
wait $pid || fail "the last resume failed: $(tail -3 "$WORK/resume.err")"
$CHECK --compare-runs "$WORK/runs/ref" "$WORK/runs/killed" 0 | tee -a "$LOG" |
  grep -q '"ok": true' || fail "the killed and resumed run differs from the reference"
put train_kills "$KILLS"
put train_stages "$("$PY" -c "import json,sys; print(sorted({json.loads(l).get('stage') for l in open(sys.argv[1]) if '\"train\"' in l}))" "$WORK/runs/ref/log.jsonl" | tr -d ' ')"
cp "$WORK/runs/ref/plot.png" "$OUT/plot.png"
fi
put load_at_end "$(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$RES" "$OUT/results.json" "$PY" <<'EOF'
import json, platform, statistics, subprocess, sys
kv = dict(l.rstrip("\n").split("=", 1) for l in open(sys.argv[1]) if "=" in l)
def num(v):
    try:
        return float(v) if "." in v else int(v)
    except ValueError:
        return v
r = {k: num(v) for k, v in kv.items()}
# Linear extrapolation to a million files: the median of the big folder's tries less the small
# one's, per file indexed (both splits).
if "index_tries" in r:
    tries = [t.split() for t in r["index_tries"].split(";") if t]
    med = lambda s, k: statistics.median(float(t[k]) for t in tries if t[0] == s)
    per_m = 1e6 / (r["index_big_files"] - r["index_small_files"])
    r["index_s_per_million_files"] = round((med("data", 1) - med("small", 1)) * per_m, 1)
    r["index_mib_per_million_files"] = round((med("data", 2) - med("small", 2)) / 1024 * per_m, 1)
if "prepare_cpu_s" in r:
    r["prepare_full_size_images_per_cpu_s"] = round(r["prepare_full_records"] / r["prepare_full_cpu_s"], 1)
    r["prepare_images_per_cpu_s"] = round(r["prepare_records"] / r["prepare_cpu_s"], 1)
r["machine"] = {"cores": int(subprocess.check_output(["nproc"]).strip()),
                "cpu": [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0],
                "os": platform.platform()}
r["versions"] = {"python": platform.python_version(),
                 "gcc": subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.strip(),
                 "libjpeg_turbo": subprocess.run("dpkg-query -W -f='${Version}' libjpeg62-turbo", shell=True, capture_output=True, text=True).stdout.strip(),
                 "pillow": subprocess.run([sys.argv[3], "-c", "import PIL; print(PIL.__version__)"], capture_output=True, text=True).stdout.strip(),
                 "skimage": subprocess.run([sys.argv[3], "-c", "import skimage; print(skimage.__version__)"], capture_output=True, text=True).stdout.strip()}
# The run-artefact schema (scripts/results_tables.py); the rehearsal's own figures stay as
# measured, under "measurements".
import datetime
out = {"schema": "vitrain-results/1",
       "what": "ImageNet-shaped rehearsal of recipes/imagenet_vit_s_24h.yaml on the CPU "
               "(bench/imagenet_rehearsal.sh)",
       "command": "bash bench/imagenet_rehearsal.sh", "commit": r.pop("commit", None),
       "date": datetime.date.today().isoformat(),
       "device": {"kind": "cpu", "name": r["machine"]["cpu"]}, "versions": r.pop("versions"),
       "log_tail": "log.txt", "figures": [], "measurements": r}
json.dump(out, open(sys.argv[2], "w"), indent=1)
EOF
say "results: $OUT/results.json"
