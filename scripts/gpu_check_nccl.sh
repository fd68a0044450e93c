#!/usr/bin/env bash
# Issue 50's device check: two NCCL ranks on one GPU (NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE=1)
# against one rank with the same global batch, under mpirun and torchrun --no_python.
#   bash scripts/gpu_check_nccl.sh [OUTDIR]      (OUTDIR: default $OUT, else /tmp/gpu_check_nccl)
# gpu_check.sh's `nccl` phase calls it with BIN (vitrain's folder), VIT_LD_LIBRARY_PATH,
# VIT_NCCL_DIR (the folder of NCCL 2.30's libnccl.so.2, put first for the ranks), DEVICE and,
# in dry runs, GPU_CHECK_DRY=1. Standalone it takes them from the bundle (gpu_bundle/env.sh).
# Dry run on the CPU: GPU_CHECK_DRY=1 BIN=build/ bash scripts/gpu_check_nccl.sh runs the same
# steps with --device cpu (MPI instead of NCCL; torchrun's steps as `vitrain launch-check`);
# with a stub vitrain it only lists the commands. The steps and pass rules are in
# scripts/gpu_check_nccl.py; OUTDIR gets results.json and log_tail.txt. Exit 0 = all passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-${OUT:-/tmp/gpu_check_nccl}}"
mkdir -p "$DEST" || exit 2
BUNDLE="${VIT_BUNDLE_DIR:-$ROOT/gpu_bundle}"
if [ "${GPU_CHECK_DRY:-0}" != 1 ] && [ -z "${BIN:-}" ] && [ -f "$BUNDLE/env.sh" ]; then
  # shellcheck source=/dev/null
  source "$BUNDLE/env.sh" >"$DEST/env.log" 2>&1
  BIN="$BUNDLE/bin"
fi
export BIN="${BIN:-$ROOT/build}" DEVICE="${DEVICE:-cuda}" GPU_CHECK_DRY="${GPU_CHECK_DRY:-0}"
export VIT_LD_LIBRARY_PATH="${VIT_LD_LIBRARY_PATH:-}" VIT_NCCL_DIR="${VIT_NCCL_DIR:-}"
[ "$GPU_CHECK_DRY" = 1 ] && export DEVICE=cpu
exec "${PY:-python3}" "$ROOT/scripts/gpu_check_nccl.py" "$DEST"
