#!/usr/bin/env bash
# The seed-method comparison of docs/benchmarks.md: the default Fashion-MNIST recipe
# (recipes/fmnist.yaml) under one wall-clock budget, without curriculum, with the image-size
# curriculum and with EfficientTrain++.
# Usage: bash bench/seed_methods.sh [BUDGET] [OUTPUT_DIR]   (defaults: 4m, output/seed_methods)
# Run it on an otherwise idle machine: the budget is wall-clock time.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-4m}
out=${2:-output/seed_methods}
mkdir -p "$out"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p') $(nproc) cores, budget $budget"
# Under a budget --epochs only shapes the schedules: warm-up over 0.2/6 of the budget, and the size
# curriculum takes 16, 20 and 24 px for a sixth of the budget each and 28 px for the last half
# (a quarter each for 16/20/24/28 left too little time at the final size: docs/benchmarks.md).
# EfficientTrain++ follows the paper's table on the fraction of the budget spent.
declare -A extra=(
  [none]=""
  [size]="--curriculum size --init-size 16 --size-step 4 --size-every 1"
  [efficienttrain]="--curriculum efficienttrain --lowfreq fft"
)
for cur in none size efficienttrain; do
  # shellcheck disable=SC2086
  ./build/vitrain train -c recipes/fmnist.yaml --budget "$budget" --epochs 6 ${extra[$cur]} --output "$out" \
    --experiment "$cur" >"$out/$cur.log" 2>&1
done
echo "| curriculum | updates | final eval top-1 (%) | eval loss | wall s (of budget) |"
echo "|---|---|---|---|---|"
for cur in none size efficienttrain; do
  last=$(tail -n 1 "$out/$cur/summary.csv")
  updates=$(grep -o '[0-9]* updates' "$out/$cur.log" | tail -n 1 | cut -d' ' -f1)
  IFS=, read -r _ _ eval_loss top1 _ _ _ seconds _ budget_s _ <<<"$last"
  echo "| $cur | $updates | $top1 | $eval_loss | $seconds ($budget_s) |"
done
