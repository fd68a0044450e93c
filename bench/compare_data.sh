#!/usr/bin/env bash
# Input-pipeline throughput per core: decode + RandomResizedCrop(224) + flip + normalise into
# (64, 3, 224, 224) batches. vitrain from an ImageFolder of real-photo JPEGs (bench/
# make_photo_jpegs.py, ImageNet-like sizes, quality 90), from `vitrain prepare` files (JPEG q90
# at max side 256, and raw), and torchvision/PIL on the same folder (bench/data_torch.py, one
# process, one thread). vitrain also with --planned: the loader's side of --augment-on-device
# (decode and plan; the resize, flip and normalisation are left to the device). Prints one table
# (median of ROUNDS runs).
#   bash bench/compare_data.sh [WORKDIR]      env: WORKERS=1 ROUNDS=3 SIZE=224 BATCHES=16
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/vitrain_data_bench}
workers=${WORKERS:-1}
rounds=${ROUNDS:-3}
size=${SIZE:-224}
batches=${BATCHES:-16}
py=/usr/bin/python3
[ -x build/vitrain ] || { echo "error: build first (bash scripts/build.sh)" >&2; exit 1; }
[ -d "$work/photos/train" ] ||
  $py bench/make_photo_jpegs.py --out "$work/photos" --train 1000 --val 200
prepare() {  # OUT FORMAT: progress goes to OUT.log, shown only on failure
  [ -f "$work/$1/val.vitpack" ] && return
  ./build/vitrain prepare --data-dir "$work/photos" --out "$work/$1" --max-side 256 \
    --format "$2" --quality 90 >"$work/$1.log" 2>&1 || { cat "$work/$1.log" >&2; exit 1; }
}
prepare packed_jpeg jpeg
prepare packed_raw raw

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p'), $workers worker(s), ${size}px, $rounds rounds"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for _ in $(seq "$rounds"); do
  for src in photos packed_jpeg packed_raw; do
    for planned in "" --planned; do
      ./build/vitrain bench-data --data-dir "$work/$src" --img-size "$size" -j "$workers" \
        --batches "$batches" $planned --json | sed "s/^{/{\"source\":\"$src\",/" >>"$results"
    done
  done
  $py bench/data_torch.py --data-dir "$work/photos" --img-size "$size" --batches "$batches" |
    sed 's/^{/{"source":"photos",/' >>"$results"
done
$py - "$results" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    impl = j["impl"] + (" --planned" if j.get("planned") else "")
    rows.setdefault((impl, j["source"]), []).append(
        (j["img_per_s_per_worker"], j.get("bytes_per_img", 3 * 4 * j.get("img_size", 224) ** 2)))
label = {"photos": "ImageFolder, JPEG q90 (~500x375)",
         "packed_jpeg": "vitrain prepare, JPEG q90, max side 256",
         "packed_raw": "vitrain prepare, raw, max side 256"}
print(f"| {'pipeline':<18} | {'source':<40} | {'img/s per core':>14} | {'bytes/img out':>13} |")
print(f"|{'-' * 20}|{'-' * 42}|{'-' * 16}|{'-' * 15}|")
for (impl, src), v in rows.items():
    rate = statistics.median(r for r, _ in v)
    out = statistics.median(b for _, b in v)
    print(f"| {impl:<18} | {label[src]:<40} | {rate:>14.1f} | {out:>13.0f} |")
PY
