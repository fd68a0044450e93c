# shellcheck shell=bash
# shellcheck disable=SC2317  # the step bodies run through `bash -c`, which shellcheck cannot see
# The `data` phase of scripts/gpu_check.sh (sourced by it; issue 15's measurements): on the
# device machine's cores and GPU, from one ImageNet-like set made there,
#   i_data_make      an ImageFolder of ImageNet-sized JPEGs (bench/make_photo_jpegs.py from the
#                    bundle's photos: ~500x375, q90) and its packed copy (vitrain prepare, JPEG
#                    q90, max side 256)
#   i_bd_*           vitrain bench-data into the model input on the device: packed and folder,
#                    planned (--augment-on-device) and host-augmented, plus DeiT's RandAugment +
#                    erasing planned; two rounds, interleaved with
#   i_tv_folder_*    torchvision's DataLoader (PIL, DATA_WORKERS workers) on the same folder, each
#                    batch copied to the GPU
#   i_train_packed   vitrain train of DATA_MODEL from the packed set (--augment-on-device), and
#   i_bench_model    vitrain bench of the same model on synthetic data: the end-to-end ratio
#   i_data_verdict   the acceptance figures: packed planned img/s (>= 15,000), its ratio to
#                    torchvision (>= 2), training over synthetic speed (>= 0.9)
# Knobs: DATA_TRAIN (50000 images) DATA_VAL (1000) DATA_WORKERS (all cores) DATA_IMG (224)
# DATA_BATCH (256) DATA_BATCHES (timed batches, 100) DATA_MODEL (vit_small_patch16_224)
# DATA_TRAIN_BUDGET (60s). A dry run on the CPU: GPU_CHECK_DEVICE=cpu with small numbers.

DATA_TRAIN="${DATA_TRAIN:-50000}"
DATA_VAL="${DATA_VAL:-1000}"
DATA_WORKERS="${DATA_WORKERS:-$(nproc)}"
DATA_IMG="${DATA_IMG:-224}"
DATA_BATCH="${DATA_BATCH:-256}"
DATA_BATCHES="${DATA_BATCHES:-100}"
DATA_MODEL="${DATA_MODEL:-vit_small_patch16_224}"
DATA_TRAIN_BUDGET="${DATA_TRAIN_BUDGET:-60s}"
INET="$WORK/inet"
INET_PACKED="$WORK/inet_packed"
MAKE_PHOTOS="$(pick bench/make_photo_jpegs.py py/make_photo_jpegs.py)"
DATA_TORCH="$(pick bench/data_torch.py py/data_torch.py)"
export DATA_TRAIN DATA_VAL DATA_WORKERS DATA_IMG DATA_BATCH DATA_BATCHES DATA_MODEL \
  DATA_TRAIN_BUDGET INET INET_PACKED MAKE_PHOTOS DATA_TORCH

# A JSON value of a metrics file: json_of ID KEY.
json_of() {
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' \
    "$MET/$1.json" "$2" 2>/dev/null
}

s_data_make() {
  need_bin vitrain
  [ -d "$BUNDLE/photos" ] || {
    note "no photos in the bundle (scripts/gpu_bundle.sh makes gpu_bundle/photos)"
    return 3
  }
  local t0=$EPOCHSECONDS
  "$PY" "$MAKE_PHOTOS" --photos-dir "$BUNDLE/photos" --out "$INET" --train "$DATA_TRAIN" \
    --val "$DATA_VAL" -j "$DATA_WORKERS" || return
  local t1=$EPOCHSECONDS
  vt prepare --data-dir "$INET" --out "$INET_PACKED" --max-side 256 --format jpeg --quality 90 \
    -j "$DATA_WORKERS" || return
  kv make_s $((t1 - t0))
  kv prepare_s $((EPOCHSECONDS - t1))
  kv folder_mib "$(du -sm "$INET" | cut -f1)"
  kv packed_mib "$(du -sm "$INET_PACKED" | cut -f1)"
  note "$DATA_TRAIN + $DATA_VAL JPEGs ($(du -sh "$INET" | cut -f1)) in $((t1 - t0)) s; packed" \
    "($(du -sh "$INET_PACKED" | cut -f1)) in $((EPOCHSECONDS - t1)) s"
}

# Args: folder|packed, then bench-data flags.
s_data_vitrain() {
  need_bin vitrain
  local src="$INET" out="$WORK/$STEP_ID.out" rc
  [ "$1" = packed ] && src="$INET_PACKED"
  shift
  [ -d "$src" ] || {
    note "no data set (i_data_make failed)"
    return 3
  }
  vt bench-data --data-dir "$src" --img-size "$DATA_IMG" -b "$DATA_BATCH" -j "$DATA_WORKERS" \
    --batches "$DATA_BATCHES" --device "$DEVICE" --json "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  last_json "$out" >"$MET/$STEP_ID.json"
  [ -s "$MET/$STEP_ID.json" ] || rm -f "$MET/$STEP_ID.json"
  [ "$rc" = 0 ] && note "$(json_of "$STEP_ID" img_per_s) img/s; device side alone" \
    "$(json_of "$STEP_ID" device_img_per_s) img/s"
  return "$rc"
}

s_data_torch() {
  [ -d "$INET" ] || {
    note "no data set (i_data_make failed)"
    return 3
  }
  local out="$WORK/$STEP_ID.out" rc dev=cpu
  [ "$DEVICE" = cuda ] && dev=cuda
  # The timed batches a multiple of the workers (they deliver in rounds), at least DATA_BATCHES.
  local n=$(((DATA_BATCHES + DATA_WORKERS - 1) / DATA_WORKERS * DATA_WORKERS))
  "$PY" "$DATA_TORCH" --data-dir "$INET" --img-size "$DATA_IMG" -b "$DATA_BATCH" \
    -j "$DATA_WORKERS" --batches "$n" --device "$dev" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  last_json "$out" >"$MET/$STEP_ID.json"
  [ -s "$MET/$STEP_ID.json" ] || rm -f "$MET/$STEP_ID.json"
  [ "$rc" = 0 ] && note "$(json_of "$STEP_ID" img_per_s) img/s"
  return "$rc"
}

# Training from the packed set; img/s: the median over the epochs after the first.
s_data_train() {
  need_bin vitrain
  [ -d "$INET_PACKED" ] || {
    note "no packed set (i_data_make failed)"
    return 3
  }
  local out="$WORK/$STEP_ID.out" rc run="$WORK/runs/data_train"
  vt train --device "$DEVICE" --model "$DATA_MODEL" --img-size "$DATA_IMG" \
    --data-dir "$INET_PACKED" -b "$DATA_BATCH" -j "$DATA_WORKERS" --augment-on-device \
    --budget "$DATA_TRAIN_BUDGET" --epochs 10 --warmup-epochs 1 --output "$WORK/runs" \
    --experiment data_train 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  mkdir -p "$LOGS/$STEP_ID"
  for f in args.yaml summary.csv log.jsonl; do
    [ -f "$run/$f" ] && cp "$run/$f" "$LOGS/$STEP_ID/"
  done
  [ "$rc" = 0 ] || return "$rc"
  local ips
  ips=$("$PY" - "$run/summary.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
rates = [float(r["img_per_s"]) for r in rows[1:]] or [float(r["img_per_s"]) for r in rows]
print(f"{statistics.median(rates):.1f}")
PY
  )
  [ -n "$ips" ] || {
    note "no epochs in summary.csv"
    return 3
  }
  printf '{"img_per_s": %s, "epochs": %s}\n' "$ips" "$(($(wc -l <"$run/summary.csv") - 1))" \
    >"$MET/$STEP_ID.json"
  note "$ips img/s (median over the epochs after the first)"
}

# The acceptance figures from the steps before; FAIL on the device when one is missed.
s_data_verdict() {
  "$PY" - "$MET" "$DEVICE" <<'PY'
import glob, json, os, statistics, sys
met, device = sys.argv[1], sys.argv[2]
def rate(prefix):
    v = []
    for f in glob.glob(os.path.join(met, prefix + "*.json")):
        try:
            v.append(float(json.load(open(f))["img_per_s"]))
        except (ValueError, KeyError):
            pass
    return statistics.median(v) if v else None
packed, folder, torch = rate("i_bd_packed_planned_r"), rate("i_bd_folder_planned_r"), rate("i_tv_")
train, bench = rate("i_train_packed"), None
try:
    bench = float(json.load(open(os.path.join(met, "i_bench_model.json")))["img_per_s"])
except (OSError, ValueError, KeyError):
    pass
checks, words = [], []
def check(name, value, goal, fmt):
    if value is None:
        words.append(f"{name}: missing")
        checks.append(False)
        return
    ok = value >= goal
    checks.append(ok)
    words.append(f"{name} {fmt.format(value)} ({'>=' if ok else '<'} {fmt.format(goal)})")
check("packed planned img/s", packed, 15000, "{:.0f}")
check("vs torchvision (same folder)", packed / torch if packed and torch else None, 2, "{:.2f}x")
if folder and torch:
    words.append(f"folder planned {folder / torch:.2f}x torchvision")
check("training / synthetic", train / bench if train and bench else None, 0.9, "{:.3f}")
print("; ".join(words))
with open(os.path.join(met, "i_data_verdict.json"), "w") as f:
    json.dump({"packed_planned_img_per_s": packed, "folder_planned_img_per_s": folder,
               "torchvision_img_per_s": torch, "train_img_per_s": train,
               "bench_img_per_s": bench, "all_met": all(checks)}, f)
sys.exit(0 if all(checks) or device != "cuda" else 1)
PY
  local rc=$?
  note "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("packed %s, folder %s, torchvision %s img/s; train %s vs bench %s; all met: %s" % tuple(d[k] for k in ("packed_planned_img_per_s","folder_planned_img_per_s","torchvision_img_per_s","train_img_per_s","bench_img_per_s","all_met")))' "$MET/i_data_verdict.json" 2>/dev/null)"
  return "$rc"
}

export -f json_of s_data_make s_data_vitrain s_data_torch s_data_train s_data_verdict

data_steps() {
  step i_data_make data 240 "ImageNet-like folder ($DATA_TRAIN JPEGs) + vitrain prepare" \
    s_data_make
  local r
  for r in 1 2; do
    # Round two in the other order: neither side always runs on a warmer page cache.
    local order=(vitrain torch)
    [ "$r" = 2 ] && order=(torch vitrain)
    for side in "${order[@]}"; do
      if [ "$side" = torch ]; then
        step "i_tv_folder_r$r" data 150 "torchvision DataLoader -j $DATA_WORKERS, folder" \
          s_data_torch
        continue
      fi
      step "i_bd_packed_planned_r$r" data 90 "bench-data packed --planned" \
        s_data_vitrain packed --planned
      step "i_bd_folder_planned_r$r" data 90 "bench-data folder --planned" \
        s_data_vitrain folder --planned
      step "i_bd_packed_host_r$r" data 90 "bench-data packed, host augmentation" \
        s_data_vitrain packed
      step "i_bd_packed_ra_r$r" data 90 "bench-data packed --planned, DeiT RandAugment + erasing" \
        s_data_vitrain packed --planned --aa rand-m9-mstd0.5-inc1 --reprob 0.25
    done
  done
  step i_bench_model data 120 "vitrain bench $DATA_MODEL b$DATA_BATCH (synthetic)" \
    s_vbench "$DATA_MODEL" "$DATA_BATCH" "$DATA_IMG"
  step i_train_packed data 180 "train $DATA_MODEL from the packed set, --augment-on-device" \
    s_data_train
  step i_data_verdict data 30 "acceptance figures (issue 15)" s_data_verdict
}
