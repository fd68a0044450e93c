#!/usr/bin/env bash
# The ablation of the 30-minute Fashion-MNIST recipe (recipes/fmnist_30m.yaml) in
# docs/benchmarks.md: the recipe, and the recipe with one component taken out (or one added), at
# the recipe's own budget, repeats interleaved (full, no-flip, ..., full, no-flip, ...) so the
# machine's drift hits every variant alike.
# Usage: bash bench/recipe_ablation.sh [OUTPUT_DIR] [REPEATS] [BUDGET]   (defaults:
# output/recipe_ablation, 1, the recipe's 28m). VARIANTS="full no_curriculum" picks variants;
# FIRST_REPEAT=3 numbers the repeats (and seeds) from 3, so two streams can share one output
# folder; EXTRA_FLAGS are passed to every run (e.g. "-j 1" for one run per core under taskset).
# Run it on an otherwise idle machine: the budget is wall-clock time, so anything else running
# costs the runs updates (and accuracy).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-output/recipe_ablation}
repeats=${2:-1}
budget=${3:-}
first=${FIRST_REPEAT:-1}
last=$((first + repeats - 1))
mkdir -p "$out"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p') $(nproc) cores, budget ${budget:-28m (the recipe)}, repeats $first-$last, extra flags '${EXTRA_FLAGS:-}'"
read -r -a variants <<<"${VARIANTS:-full no_conv_stem no_curriculum no_flip no_crop plus_ema plus_erasing}"
declare -A variant_flags=(
  [full]=""
  [no_conv_stem]="--stem patch"
  [no_curriculum]="--curriculum none"
  [no_flip]="--hflip 0"
  [no_crop]="--crop-pad 0"
  [plus_ema]="--model-ema --model-ema-decay 0.9995 --model-ema-warmup"
  [plus_erasing]="--reprob 0.25"
)
for r in $(seq "$first" "$last"); do
  for v in "${variants[@]}"; do
    [ -n "${variant_flags[$v]+x}" ] || { echo "unknown variant '$v'" >&2; exit 2; }
    # shellcheck disable=SC2086
    ./build/vitrain train -c recipes/fmnist_30m.yaml ${budget:+--budget "$budget"} \
      ${variant_flags[$v]} ${EXTRA_FLAGS:-} --seed "$r" --output "$out" --experiment "$v-$r" >"$out/$v-$r.log" 2>&1
  done
done
echo "| variant | flags | run | last epoch (0-based, partial) | final eval top-1 (%) | eval loss |"
echo "|---|---|---|---|---|---|"
for v in "${variants[@]}"; do
  for r in $(seq "$first" "$last"); do
    row=$(tail -n 1 "$out/$v-$r/summary.csv")
    IFS=, read -r epoch _ eval_loss top1 _ <<<"$row"
    echo "| $v | ${variant_flags[$v]:-(the recipe)} | $r | $epoch | $top1 | $eval_loss |"
  done
done
