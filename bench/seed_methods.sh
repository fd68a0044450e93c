#!/usr/bin/env bash
# The seed-method comparison of docs/benchmarks.md: the default Fashion-MNIST recipe
# (recipes/fmnist.yaml) under one wall-clock budget, without curriculum, with the image-size
# curriculum and with EfficientTrain++ (two size tables searched for this 28-px model, and the
# paper's DeiT table for reference).
# Usage: bash bench/seed_methods.sh [BUDGET] [OUTPUT_DIR] [REPEATS] [EXTRA_FLAGS]   (defaults: 4m,
# output/seed_methods, 1, none). EXTRA_FLAGS go to every method, e.g. "--aa rand-m9-mstd0.5-inc1"
# (RandAugment, whose magnitude EfficientTrain++ schedules). METHODS="none size" picks methods.
# Run it on an otherwise idle machine: the budget is wall-clock time.
# Repeats are interleaved (none, size, ..., none, size, ...) so slow drift hits every method.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-4m}
out=${2:-output/seed_methods}
repeats=${3:-1}
extra_flags=${4:-}
mkdir -p "$out"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p') $(nproc) cores, budget $budget, extra flags '$extra_flags'"
# Under a budget --epochs only shapes the schedules: warm-up over 0.2/6 of the budget, and the size
# curriculum takes 16, 20 and 24 px for a sixth of the budget each and 28 px for the last half
# (a quarter each for 16/20/24/28 left too little time at the final size: docs/benchmarks.md).
# EfficientTrain++ follows its table on the fraction of the budget spent, warm-up 20%: 40% or half
# of the budget at 28 px (the tables searched for this model), or the paper's DeiT table.
read -r -a methods <<<"${METHODS:-none size efficienttrain efficienttrain_half efficienttrain_deit}"
declare -A method_flags=(
  [none]=""
  [size]="--curriculum size --init-size 16 --size-step 4 --size-every 1"
  [efficienttrain]="--curriculum efficienttrain --lowfreq fft --et-table 16,16,20,20,24,24,28,28,28,28"
  [efficienttrain_half]="--curriculum efficienttrain --lowfreq fft --et-table 16,16,20,20,24,28,28,28,28,28"
  [efficienttrain_deit]="--curriculum efficienttrain --lowfreq fft --et-table deit"
)
for r in $(seq 1 "$repeats"); do
  for m in "${methods[@]}"; do
    # shellcheck disable=SC2086
    ./build/vitrain train -c recipes/fmnist.yaml --budget "$budget" --epochs 6 ${method_flags[$m]} $extra_flags \
      --output "$out" --experiment "$m-$r" >"$out/$m-$r.log" 2>&1
  done
done
echo "| method | run | updates | final eval top-1 (%) | eval loss | wall s (of budget) |"
echo "|---|---|---|---|---|---|"
for m in "${methods[@]}"; do
  for r in $(seq 1 "$repeats"); do
    last=$(tail -n 1 "$out/$m-$r/summary.csv")
    updates=$(grep -o '[0-9]* updates' "$out/$m-$r.log" | tail -n 1 | cut -d' ' -f1)
    IFS=, read -r _ _ eval_loss top1 _ _ _ seconds _ budget_s _ <<<"$last"
    echo "| $m | $r | $updates | $top1 | $eval_loss | $seconds ($budget_s) |"
  done
done
