#!/usr/bin/env bash
# Where a training step's device time goes, on the GPU machine (gpu_bundle/ carried):
#   bash scripts/gpu_profile.sh [DEST]
# vitrain: one bench step under Nsight Compute (kernel durations only, clocks left alone), summed
# per kernel name; timm eager: one step under torch.profiler. Models: PROFILE_MODELS
# ("model:batch ...", default ViT-S/16 at 256 and ViT-Ti/4 at 1024). Writes DEST/profile.txt
# (default $OUT) and prints it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
DEST="${1:-${OUT:-/tmp/gpu_profile}}"
mkdir -p "$DEST"
# shellcheck source=/dev/null
source gpu_bundle/env.sh >/dev/null 2>&1 || { echo "gpu_profile: gpu_bundle/env.sh failed"; exit 2; }
PY="${PYTHON:-python3}"
REPORT="$DEST/profile.txt"
: >"$REPORT"
for mb in ${PROFILE_MODELS:-vit_small_patch16_224:256 vit_tiny_patch4_32:1024}; do
  m="${mb%%:*}" b="${mb##*:}"
  csv="$(mktemp)"
  LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH" timeout 300 ncu --clock-control none \
    --metrics gpu__time_duration.sum --csv --print-units base \
    gpu_bundle/bin/vitrain bench --device cuda --model "$m" -b "$b" --steps 1 --warmup 0 \
    >"$csv" 2>"$csv.err"
  echo "ncu exit $? for $m" >>"$REPORT"
  tail -n 3 "$csv.err" >>"$REPORT"
  "$PY" - "$csv" "$m" "$b" >>"$REPORT" <<'PY'
import csv, sys, collections
path, model, batch = sys.argv[1:4]
rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
if not rows:
    print("no ncu rows"); sys.exit()
h = rows[0]
ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    if r[mi] != "gpu__time_duration.sum":
        continue
    name = r[ki].split("(")[0][:90]
    tot[name] += float(r[vi].replace(",", "")) / 1e6  # ns -> ms
    cnt[name] += 1
all_ms = sum(tot.values())
print(f"\n## vitrain {model} batch {batch}: one step (warm-up 0, so it includes any first-call"
      f" work), {sum(cnt.values())} kernels, {all_ms:.2f} ms of kernel time")
print(f"{'ms':>8} {'%':>6} {'calls':>6}  kernel")
for n, t in sorted(tot.items(), key=lambda x: -x[1])[:40]:
    print(f"{t:8.3f} {100 * t / all_ms:6.1f} {cnt[n]:6d}  {n}")
PY
  rm -f "$csv" "$csv.err"
done
for mb in ${PROFILE_MODELS:-vit_small_patch16_224:256 vit_tiny_patch4_32:1024}; do
  m="${mb%%:*}" b="${mb##*:}"
  echo -e "\n## timm eager $m batch $b (torch.profiler, one step)" >>"$REPORT"
  PYTHONUNBUFFERED=1 timeout 200 "$PY" bench/torch_train_bench.py --model "$m" --batch "$b" \
    --steps 5 --warmup 3 --profile --json >>"$REPORT" 2>&1
done
cat "$REPORT"
