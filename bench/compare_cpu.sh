#!/usr/bin/env bash
# The engine benchmark of docs/benchmarks.md: one training step (forward, backward, AdamW) of a
# ViT with C=192, L=6, H=3, 8x8 tokens, avg classifier, batch 128, on 2 threads — vitrain and
# PyTorch eager (OpenBLAS), in the same run. Prints two JSON lines per round.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p') $(nproc) cores"
echo "# torch BLAS: $(/usr/bin/python3 -c 'import torch; print(torch.__config__.show())' | grep -o 'BLAS_INFO=[a-z]*')"
for _ in $(seq "$rounds"); do
  ./build/vitrain bench --model vit_bench_cpu -b 128 --threads 2 --steps 10 --warmup 2 --json
  /usr/bin/python3 bench/compare_torch.py --threads 2 --batch 128 --steps 10 --warmup 2 2>/dev/null
done
