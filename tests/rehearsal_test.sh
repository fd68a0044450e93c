#!/usr/bin/env bash
# The ImageNet recipe's rehearsal in small (docs/rehearsal.md): an ImageNet-shaped folder of a few
# hundred files with every oddity, `vitrain prepare` killed with SIGKILL and re-run, and
# recipes/imagenet_vit_s_24h.yaml trained with CPU overrides through EfficientTrain++ stages,
# killed with SIGKILL and resumed bitwise (losses and EMA) across a stage boundary.
#   rehearsal_test.sh VITRAIN PYTHON SOURCE_DIR
set -euo pipefail
VITRAIN=$1 PY=$2 SRC=$3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
CHECK="$PY $SRC/tests/rehearsal_check.py"
# The generator needs Debian's python3-skimage and PIL: without them the test is skipped (77).
"$PY" -c "import skimage.data, PIL" 2> /dev/null || { echo "SKIP: no skimage/PIL in $PY"; exit 77; }

# 1. The data set: 256 train + 64 val files, 1000 classes, every oddity in each split.
"$PY" "$SRC/bench/make_imagenet_like.py" --out "$W/data" --train 256 --val 64 --scale 0.15 \
  --seed 3 -j 2 > /dev/null
M=$W/data/manifest.tsv
[ "$(ls "$W/data/train" | wc -l)" = 1000 ] || fail "expected 1000 class folders"
dups=$(awk -F'\t' 'NR > 1 && $4 != "empty" {print $8}' "$M" | sort | uniq -d | wc -l)
[ "$dups" = 0 ] || fail "$dups files are byte-equal to another"
for k in cmyk grey png truncated empty deep unicode; do
  grep -q "	$k	" "$M" || fail "no $k file in the set"
done

# 2. prepare, uninterrupted: the reference. Each undecodable file (empty, truncated: 2 a split)
# gets one warning and is counted; the rest (CMYK, grey, PNG named .JPEG, deep, non-ASCII) are
# packed.
prep() { "$VITRAIN" prepare --data-dir "$W/data" --out "$1" --max-side 40 -j 2; }
prep "$W/ref" > "$W/ref.out" 2> "$W/ref.err" || fail "prepare: $(tail -3 "$W/ref.err")"
[ "$(grep -c '^warning: skipping' "$W/ref.err")" = 4 ] || fail "expected 4 warnings: $(cat "$W/ref.err")"
grep -q "254 train + 62 val images (1000 classes" "$W/ref.out" || fail "counts: $(cat "$W/ref.out")"
grep -q "4 skipped" "$W/ref.out" || fail "skip count: $(cat "$W/ref.out")"
for s in train val; do
  $CHECK "$W/ref/$s.vitpack" "$M" $s 40 > "$W/check.json" || fail "$(cat "$W/check.json")"
done

# Those used are decoded as PIL decodes them (CMYK, greyscale, the PNG too): a raw, full-size pack.
"$VITRAIN" prepare --data-dir "$W/data" --out "$W/raw" --max-side 0 --format raw -j 2 > /dev/null 2>&1
$CHECK "$W/raw/train.vitpack" "$M" train 0 --pixels "$W/data/train" > "$W/check.json" ||
  fail "$(cat "$W/check.json")"

# 3. prepare killed with SIGKILL while it writes, then re-run: no partial pack is ever in place,
# the dead run's temp file is removed, and every record matches the reference.
for delay in 0 0.2; do
  rm -rf "$W/pk"
  prep "$W/pk" > /dev/null 2>&1 &
  pid=$!
  for _ in $(seq 400); do compgen -G "$W/pk/*.tmp.*" > /dev/null && break; sleep 0.01; done
  sleep "$delay"
  kill -9 $pid 2> /dev/null || true
  wait $pid 2> /dev/null || true
  for s in train val; do # whatever is in place is whole
    if [ -e "$W/pk/$s.vitpack" ]; then
      $CHECK "$W/pk/$s.vitpack" "$M" $s 40 --ref "$W/ref/$s.vitpack" > /dev/null ||
        fail "a killed prepare left a bad $s.vitpack"
    fi
  done
  prep "$W/pk" > /dev/null 2> "$W/pk.err" || fail "prepare re-run: $(tail -3 "$W/pk.err")"
  ! compgen -G "$W/pk/*.tmp.*" > /dev/null || fail "temp files left: $(ls "$W/pk")"
  for s in train val; do
    $CHECK "$W/pk/$s.vitpack" "$M" $s 40 --ref "$W/ref/$s.vitpack" > "$W/check.json" ||
      fail "after kill at +${delay}s: $(cat "$W/check.json")"
  done
done

# 4. The recipe, unchanged but for CPU overrides, on the ImageFolder itself (the oddities meet the
# streaming loader): a tiny preset at 32 px, batch 32, and the compute of one epoch at 32 px
# (EfficientTrain++ spends it over about 3 epochs of smaller images) instead of 24 hours.
train() {
  "$VITRAIN" train -c "$SRC/recipes/imagenet_vit_s_24h.yaml" --data-dir "$W/data" \
    --model vit_tiny_patch4_32 --img-size 32 --device cpu --precision fp32 -b 32 \
    --budget "" --epochs 1 -j 2 --log-interval 1 --output "$W/runs" --experiment "$@"
}
train straight > "$W/straight.out" 2> "$W/straight.err" ||
  fail "recipe run: $(tail -5 "$W/straight.err")"
R=$W/runs/straight
stages=$($PY -c "import json,sys; print(len({json.loads(l).get('stage') for l in open(sys.argv[1]) if '\"train\"' in l}))" "$R/log.jsonl")
[ "$stages" -ge 2 ] || fail "only $stages EfficientTrain++ stage(s) ran"
for f in last.safetensors last_ema.safetensors state.safetensors plot.png summary.csv; do
  [ -s "$R/$f" ] || fail "no $f in the run folder"
done
# Each unreadable file of the folder is one warning (2 a split), and none stops the run.
[ "$(grep -c '^warning: skipping unreadable' "$W/straight.err")" = 4 ] ||
  fail "expected 4 unreadable-file warnings: $(grep warning "$W/straight.err")"

# 5. The same run killed with SIGKILL after its first checkpoint, then --resume: the losses and the
# EMA weights are the uninterrupted run's, bit for bit.
train split > /dev/null 2>&1 &
pid=$!
for _ in $(seq 6000); do [ -e "$W/runs/split/state.safetensors" ] && break; sleep 0.02; done
kill -9 $pid 2> /dev/null || true
wait $pid 2> /dev/null || true
[ -e "$W/runs/split/state.safetensors" ] || fail "no checkpoint before the kill"
"$VITRAIN" train --resume "$W/runs/split" > "$W/resume.out" 2> "$W/resume.err" ||
  fail "resume: $(tail -5 "$W/resume.err")"
from=$(sed -n 's/^Resumed at epoch [0-9]* update [0-9]* (step \([0-9]*\)).*/\1/p' "$W/resume.out")
[ -n "$from" ] || fail "the resume did not say where it resumed: $(head -5 "$W/resume.out")"
$CHECK --compare-runs "$R" "$W/runs/split" "$from" > "$W/compare.json" ||
  fail "the resumed run differs from the uninterrupted one: $(cat "$W/compare.json")"
# The resumed part crosses a stage boundary: its steps span two stages or more.
grep -q '"stages_after_resume": \[[0-9]*, [0-9]' "$W/compare.json" ||
  fail "the resume crossed no EfficientTrain++ stage boundary: $(cat "$W/compare.json")"
echo "rehearsal: prepare killed and re-run twice, recipe resumed bitwise: $(cat "$W/compare.json")"
