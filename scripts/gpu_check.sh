#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step bodies run through `bash -c`, which shellcheck cannot see
# The one-call GPU device check (issues 46, 48, 50). A session with a device first builds, here,
#   JOBS=2 bash scripts/gpu_bundle.sh
# and then makes ONE device call:
#   run(command='bash scripts/gpu_check.sh session', carry=["gpu_bundle"], timeout_s=600)
# What the budget leaves as SKIP can take the rest of the session's device time in a second call
# on the warm machine, e.g. GPU_CHECK_BUDGET_S=200 bash scripts/gpu_check.sh plan.
#
#   bash scripts/gpu_check.sh [PHASES] [DEST]   PHASES: comma-separated, in this order:
#     verify  versions (GPU, driver, CUDA, cuBLASLt, PyTorch, timm); every bundled GPU test
#             binary with VIT_REQUIRE_GPU=1; compute-sanitizer memcheck on the op tests; the
#             default recipe (vitrain train) and its top-1; bench/timm_load_check.py (timm's
#             vit_small_patch16_224 loads a ViT-S/16 token export, logits vs vitrain eval)
#     speed   issue 48's side-by-side table, per model: vitrain bench (its plan, autotune on),
#             then timm in one process (bench/timm_bench.py: eager, torch.compile default,
#             reduce-overhead, max-autotune-no-cudagraphs, interleaved chunks, each compile
#             capped); ViT-S/16 with the locality FFN against plain
#     nccl    scripts/gpu_check_nccl.sh (two ranks on one GPU, NCCL 2.30), where it exists
#     plan    the device's plan (kernels.json of a short autotuned train run), then the variants
#             of scripts/gpu_presets.tsv (autotune on vs off among them) with bench --variant
#     tta     time to accuracy: the default recipe by vitrain (verify's run where it passed in
#             this call) and by bench/torch_fmnist_loop.py (PyTorch), per-epoch top-1 vs wall time
#     session = verify,speed,nccl,plan,tta (the default); dry = session on the CPU with stub
#             commands (scripts/gpu_check_stub.sh), no GPU or bundle needed
# Each step has a cap and an expected time; a step the budget (GPU_CHECK_BUDGET_S, 540) cannot fit
# is SKIP. DEST (default $OUT, else /tmp/gpu_check_out) is rewritten after every step, and
# commits unchanged as docs/runs/<date>-gpu-check/: results.json (schema: the top of
# scripts/gpu_check_report.py), summary.md, log_tails.txt, kernels.json (the device's plan);
# logs.tar.gz holds every log (not for committing).
# Knobs: GPU_CHECK_DRY=1, GPU_CHECK_DRY_VITRAIN (dry runs with this real CPU vitrain),
# GPU_CHECK_SPEED_MODELS ("model:batch:steps ..."), GPU_CHECK_TIMM_MODES, GPU_CHECK_COMPILE_CAP_S
# (150), GPU_CHECK_ROUNDS (3), GPU_CHECK_PRESETS (file), GPU_CHECK_MEMCHECK_FILTER,
# GPU_CHECK_REF_TOP1 (the recipe's top-1 before the changes), PYTHON (the one with torch, timm).
set -uo pipefail # no -e: a failing step is recorded and the rest still run
export LC_ALL=C GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

phases="${1:-session}"
case "$phases" in */* | .) phases=session ;; *) shift ;; esac
[ "$phases" = dry ] && phases=session && export GPU_CHECK_DRY=1
[ "$phases" = session ] && phases=verify,speed,nccl,plan,tta
for p in ${phases//,/ }; do
  case "$p" in verify | speed | nccl | plan | tta) ;; *)
    echo "gpu_check: unknown phase '$p' (session, dry, verify, speed, nccl, plan, tta)" >&2
    exit 2
    ;;
  esac
done
want() { [[ ",$phases," == *",$1,"* ]]; }
DEST="${1:-${OUT:-/tmp/gpu_check_out}}"
DRY="${GPU_CHECK_DRY:-0}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
RESERVE_S=15 # the report and the packing at the end
START_S=$EPOCHSECONDS
DEADLINE_S=$((START_S + BUDGET_S))
ROUNDS="${GPU_CHECK_ROUNDS:-3}"
COMPILE_CAP_S="${GPU_CHECK_COMPILE_CAP_S:-150}"
TIMM_MODES="${GPU_CHECK_TIMM_MODES:-eager,default,reduce-overhead,max-autotune-no-cudagraphs}"
PY="${PYTHON:-python3}"
BUNDLE="${VIT_BUNDLE_DIR:-$ROOT/gpu_bundle}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
LOGS="$WORK/logs" MET="$WORK/metrics"
mkdir -p "$LOGS" "$MET" "$WORK/notes" "$DEST" || exit 2
: >"$WORK/steps.tsv"
# The tree's own files (newest), else the bundle's copies.
pick() { if [ -f "$ROOT/$1" ]; then echo "$ROOT/$1"; else echo "$BUNDLE/$2"; fi; }
REPORT_PY="$(pick scripts/gpu_check_report.py gpu_check_report.py)"
PRESETS="${GPU_CHECK_PRESETS:-$(pick scripts/gpu_presets.tsv gpu_presets.tsv)}"
RECIPE="$(pick recipes/fmnist.yaml recipes/fmnist.yaml)"
STUB="$ROOT/scripts/gpu_check_stub.sh"
DATA="$BUNDLE/data/fashion-mnist" BIN="$BUNDLE/bin" DEVICE=cuda TRAIN_FLAGS=""
TIMM_RUN="$PY $(pick bench/timm_bench.py py/timm_bench.py)"
TIMM_LOAD_RUN="$PY $(pick bench/timm_load_check.py py/timm_load_check.py)"
TORCH_LOOP_RUN="$PY $(pick bench/torch_fmnist_loop.py py/torch_fmnist_loop.py)"
SPEED_MODELS="${GPU_CHECK_SPEED_MODELS:-vit_small_patch16_224:256:120 vit_tiny_patch4_32:1024:250 vit_base_patch16_224:256:60}"
# The default recipe's top-1 on the H100/H200 before the kernel plan (docs/lab/gpu-notebook.md):
# the report checks the run stays within 0.3 points of it.
export GPU_CHECK_REF_TOP1="${GPU_CHECK_REF_TOP1:-91.62}"
MEMCHECK_FILTER="${GPU_CHECK_MEMCHECK_FILTER:-CudaOps/bf16.*:CudaOps/fp32.LayerNorm:CudaOps/fp32.Pool:CudaRuntime.*:CudaAdamW.MatchesCpu-*Matmul*}"

ENV_OK=0
if [ "$DRY" = 1 ]; then
  # Every command a step runs, stubbed (gpu_check_stub.sh answers by the name it is called by).
  BIN="$WORK/stub" DATA="$WORK/stub_data" DEVICE=cpu ENV_OK=1
  mkdir -p "$BIN" "$DATA"
  for c in vitrain test_cuda_ops test_cuda_model test_cuda_flash_attention nvidia-smi \
    compute-sanitizer timm_bench timm_load_check torch_fmnist_loop; do ln -s "$STUB" "$BIN/$c"; done
  TIMM_RUN="$BIN/timm_bench" TIMM_LOAD_RUN="$BIN/timm_load_check"
  TORCH_LOOP_RUN="$BIN/torch_fmnist_loop"
  if [ -n "${GPU_CHECK_DRY_VITRAIN:-}" ]; then
    rm -f "$BIN/vitrain" && ln -s "$(realpath "$GPU_CHECK_DRY_VITRAIN")" "$BIN/vitrain"
    SPEED_MODELS="${GPU_CHECK_SPEED_MODELS:-vit_bench_cpu:8:3}" DATA=/usr/share/datasets/fashion-mnist
    TRAIN_FLAGS="--budget 15s"
  fi
  export PATH="$BIN:$PATH"
  echo "gpu_check: DRY RUN (stub commands in $BIN): the figures are made up" | tee "$LOGS/env.log"
elif [ -f "$BUNDLE/env.sh" ]; then
  # shellcheck source=/dev/null
  source "$BUNDLE/env.sh" >"$LOGS/env.log" 2>&1 && ENV_OK=1
  cat "$LOGS/env.log"
else
  echo "gpu_check: no bundle at $BUNDLE (run scripts/gpu_bundle.sh here, carry gpu_bundle)" |
    tee "$LOGS/env.log"
fi
export ROOT WORK LOGS MET BUNDLE BIN PY DATA DEVICE RECIPE ENV_OK DRY GPU_CHECK_DRY="$DRY" TIMM_RUN COMPILE_CAP_S \
  TIMM_LOAD_RUN TORCH_LOOP_RUN \
  TIMM_MODES ROUNDS MEMCHECK_FILTER TRAIN_FLAGS VIT_LD_LIBRARY_PATH="${VIT_LD_LIBRARY_PATH:-}"
echo "gpu_check: phases $phases, budget ${BUDGET_S}s, work dir $WORK, results to $DEST"

# ---------------------------------------------------------------------------------------------
# Step bodies. Each runs in its own bash under `timeout`, stdout+stderr to logs/ID.log; it leaves
# key=value metrics in metrics/ID.kv, JSON lines (figures) in metrics/ID.jsonl, a note in notes/ID.

# vitrain with our libraries; nothing else (PyTorch) sees VIT_LD_LIBRARY_PATH.
vt() { LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH" "$BIN/vitrain" "$@"; }
note() { printf '%s\n' "$*" >"$WORK/notes/$STEP_ID"; }
kv() { printf '%s=%s\n' "$1" "$2" >>"$MET/$STEP_ID.kv"; }
need_bin() {
  [ "$ENV_OK" = 1 ] || { note "bundle environment failed (logs/env.log)" && exit 3; }
  [ -x "$BIN/$1" ] || { note "$1 is not in the bundle" && exit 3; }
}
json_lines() { grep -E '^\{.*\}$' "$1" >>"$MET/$STEP_ID.jsonl"; }
# No JSON line: a failed run's last log line says why (step's note); else say so.
no_json() { [ "$1" != 0 ] || note "exit 0 but no JSON line"; return "$(($1 ? $1 : 3))"; }

s_info() {
  echo "--- bundle"
  head -n 30 "$BUNDLE/MANIFEST.txt" 2>/dev/null
  kv commit "$(grep -m1 '^commit:' "$BUNDLE/MANIFEST.txt" 2>/dev/null | cut -d' ' -f2)"
  kv local_changes "$(sed -n '/^local changes/,/^nvcc:/p' "$BUNDLE/MANIFEST.txt" 2>/dev/null |
    grep -c '^  ')"
  kv cpu "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  kv nvcc "$( (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null |
    grep -o 'release [0-9.]*' | cut -d' ' -f2)"
  local lt
  lt=$(readlink -f "${VIT_CUBLASLT_DIR:-/nonexistent}/libcublasLt.so.13" 2>/dev/null)
  [ -f "$lt" ] && kv cublaslt "${lt##*.so.}"
  kv torch "$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  kv timm "$("$PY" -c 'import timm; print(timm.__version__)' 2>/dev/null)"
  echo "--- compute-sanitizer" && compute-sanitizer --version 2>&1 | head -n 2
  echo "--- nvidia-smi"
  nvidia-smi || { note "nvidia-smi failed" && return 3; }
  local q
  q=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv,noheader 2>/dev/null | head -n 1)
  IFS=, read -r name drv mem cc <<<"$q"
  kv gpu "${name# }" && kv driver "${drv# }" && kv gpu_memory "${mem# }" && kv cc "${cc# }"
  kv cuda_driver "$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | cut -d' ' -f3)"
  [ "$ENV_OK" = 1 ] || { note "bundle environment failed (logs/env.log)" && return 3; }
  note "$(grep -E '^(gpu|driver|cublaslt|torch|timm)=.' "$MET/$STEP_ID.kv" | paste -sd' ')"
}

# A gtest binary with VIT_REQUIRE_GPU=1 (a skipped test fails: it means no device). Args:
# binary, gtest filter ("" = all), then an optional wrapper (compute-sanitizer ...).
s_gtest() {
  local bin="$1" filter="$2" out="$WORK/$STEP_ID.out" rc
  shift 2
  need_bin "$bin"
  VIT_REQUIRE_GPU=1 LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH" "$@" "$BIN/$bin" --gtest_color=no \
    ${filter:+--gtest_filter="$filter"} --gtest_output="xml:$LOGS/$STEP_ID.xml" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  local passed failed skipped errs first
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out" | grep -oE '[0-9]+$' | tail -n 1)
  failed=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$out" | grep -oE '[0-9]+' | tail -n 1)
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$out" | grep -oE '[0-9]+' | tail -n 1)
  errs=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$out" | grep -oE '[0-9]+' | tail -n 1)
  kv passed "${passed:-0}" && kv failed "${failed:-0}" && kv skipped "${skipped:-0}"
  [ -n "$errs" ] && kv sanitizer_errors "$errs"
  first=$(grep -m1 -E '^\[  FAILED  \] [A-Za-z]' "$out" | sed 's/^\[  FAILED  \] //')
  note "${passed:-0} passed${failed:+, $failed failed}${skipped:+, $skipped skipped}${errs:+, sanitizer: $errs errors}${first:+; first: $first}"
  [ "$rc" = 0 ] && [ "${skipped:-0}" != 0 ] && return 3 # VIT_REQUIRE_GPU=1 yet skipped
  [ "$rc" = 0 ] && [ "${passed:-0}" = 0 ] && note "no test ran${filter:+ (filter $filter)}" && return 3
  return "$rc"
}
# Args: binary, filter: s_gtest under compute-sanitizer memcheck; any report fails the step.
s_memcheck() {
  command -v compute-sanitizer >/dev/null || { note "no compute-sanitizer" && return 3; }
  s_gtest "$1" "$2" compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 30
}

# Args: experiment, then train flags. The run folder's files go to logs/ID/.
s_train() {
  local exp="$1" out="$WORK/$STEP_ID.out" rc top1 run
  shift
  need_bin vitrain
  # shellcheck disable=SC2086  # TRAIN_FLAGS: extra flags (dry runs), split on purpose
  vt train -c "$RECIPE" --device "$DEVICE" --data-dir "$DATA" --output "$WORK/runs" \
    --experiment "$exp" "$@" $TRAIN_FLAGS 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  top1=$(grep -oE 'Final test top-1: [0-9.]+' "$out" | grep -oE '[0-9.]+$' | tail -n 1)
  run=$(grep -oE 'Run folder: .*' "$out" | sed 's/^Run folder: //' | tail -n 1)
  [ -n "$run" ] && [ -d "$run" ] || run="$WORK/runs/$exp"
  mkdir -p "$LOGS/$STEP_ID"
  for f in args.yaml summary.csv kernels.json plot.png; do
    [ -f "$run/$f" ] && cp "$run/$f" "$LOGS/$STEP_ID/"
  done
  [ -n "$top1" ] && kv top1 "$top1"
  [ "$rc" = 0 ] || return "$rc"
  [ -n "$top1" ] || [ -n "${NO_TOP1:-}" ] || { note "no 'Final test top-1' line" && return 3; }
  [ -f "$run/kernels.json" ] || { note "no kernels.json in the run folder" && return 5; }
  note "${top1:+top-1 $top1%; }plan: $(grep -o '"variant"' "$run/kernels.json" | wc -l) ops"
}
s_recipe() { s_train fmnist_default; }
# The device's plan: a short run with the autotuner on; its kernels.json is the artefact.
s_plan() { NO_TOP1=1 s_train plan_tuned --kernels autotune=on --stop-after-updates 200; }

# Args: figure name, model, batch, steps, then bench flags. One vitrain bench (its plan with the
# autotuner on); the JSON line is the figure.
s_vbench() {
  local name="$1" model="$2" batch="$3" steps="$4" out="$WORK/$STEP_ID.out" rc
  shift 4
  need_bin vitrain
  vt bench --device "$DEVICE" --model "$model" -b "$batch" --steps "$steps" --warmup 10 \
    --kernels autotune=on --json "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  json_lines "$out" || { no_json "$rc"; return; }
  kv figure "$name" && kv steps "$steps"
  return "$rc"
}
# Args: model, batch. timm's modes interleaved in one process, each compile under its cap.
s_timm() {
  local out="$WORK/$STEP_ID.out" rc
  # shellcheck disable=SC2086  # TIMM_RUN: "python3 path" or the dry run's stub
  PYTHONUNBUFFERED=1 $TIMM_RUN --model "$1" --batch "$2" --modes "$TIMM_MODES" --seconds 3 \
    --compile-cap "$COMPILE_CAP_S" --budget-s $((STEP_TIMEOUT - 20)) --json 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  json_lines "$out" || { no_json "$rc"; return; }
  note "$(grep -oE '"(name|status)": ?"[^"]*"' "$MET/$STEP_ID.jsonl" | cut -d'"' -f4 |
    paste -sd' ' | sed 's/ ok//g')"
  return "$rc"
}
# Args: model, batch, steps, bench flags ("" or "--ffn local"), then NAME:KERNELS variants.
s_variants() {
  local model="$1" batch="$2" steps="$3" flags="$4" out="$WORK/$STEP_ID.out" rc v args=()
  shift 4
  need_bin vitrain
  for v in "$@"; do args+=(--variant "$v"); done
  # shellcheck disable=SC2086  # flags: split on purpose
  vt bench --device "$DEVICE" --model "$model" -b "$batch" --steps "$steps" --warmup 10 --json \
    --rounds "$ROUNDS" $flags "${args[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  json_lines "$out" || { no_json "$rc"; return; }
  note "$(grep -oE 'variant [^ ]+ failed: .{0,80}' "$out" | head -n 3 | paste -sd';')"
  return "$rc"
}
# Two NCCL ranks on one GPU (issue 50): scripts/gpu_check_nccl.sh OUTDIR, with BIN (vitrain and
# the test binaries), VIT_LD_LIBRARY_PATH, VIT_NCCL_DIR (NCCL 2.30's folder, to put first for the
# ranks), DATA, DEVICE and GPU_CHECK_DRY=1 in dry runs set; exit 0 passes. An OUTDIR/results.json
# it writes is embedded in ours as "nccl".
s_nccl() {
  need_bin vitrain
  local d="$LOGS/$STEP_ID"
  mkdir -p "$d"
  VIT_NCCL_DIR="${VIT_NCCL_DIR:-}" bash "$ROOT/scripts/gpu_check_nccl.sh" "$d"
  local rc=$?
  [ -f "$d/results.json" ] && cp "$d/results.json" "$MET/$STEP_ID.nccl.json"
  return "$rc"
}
# timm's vit_small_patch16_224 (class token) loads vitrain's export of a ViT-S/16 trained for
# one short epoch; logits against vitrain eval (fp32 and bf16) on seeded 224-pixel PNGs.
s_timm_load() {
  local out="$WORK/$STEP_ID.out" rc
  need_bin vitrain
  # shellcheck disable=SC2086  # TIMM_LOAD_RUN: "python3 path" or the dry run's stub
  $TIMM_LOAD_RUN --vitrain "$BIN/vitrain" --device "$DEVICE" --work "$WORK/timm_load" 2>&1 |
    tee "$out"
  rc=${PIPESTATUS[0]}
  json_lines "$out" || { no_json "$rc"; return; }
  local err
  err=$(grep -m1 -oE '"error": "[^"]*' "$MET/$STEP_ID.jsonl" | cut -d'"' -f4)
  note "${err:-$(grep -cE ': pass$' "$out")/$(grep -cE ': (pass|FAIL)$' "$out") loader x precision \
pairs match$(grep -m1 ' did not load: ' "$out" | cut -c17-120 | sed 's/^/; /')}"
  return "$rc"
}
# The default recipe in a plain PyTorch loop (bench/torch_fmnist_loop.py): a JSON line an epoch.
s_torch_loop() {
  local out="$WORK/$STEP_ID.out" rc
  # shellcheck disable=SC2086  # TORCH_LOOP_RUN: "python3 path" or the dry run's stub
  PYTHONUNBUFFERED=1 $TORCH_LOOP_RUN --recipe "$RECIPE" --data-dir "$DATA" --device "$DEVICE" \
    2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  json_lines "$out" || { no_json "$rc"; return; }
  note "$(grep -oE '"(top1_final|loop_s|setup_s)": [0-9.]+' "$MET/$STEP_ID.jsonl" | tr -d '"' |
    paste -sd' ')"
  return "$rc"
}
for f in $(compgen -A function | grep -E '^(s_|vt$|note$|kv$|need_bin$|json_lines$|no_json$)'); do
  export -f "${f?}"
done

# ---------------------------------------------------------------------------------------------
# The runner.

# The report: DEST/{results.json, summary.md, log_tails.txt, kernels.json, logs.tar.gz}.
report() {
  "$PY_REPORT" "$REPORT_PY" "$WORK" "$phases" "$START_S" "$BUDGET_S" "$1" "$DRY" ||
    { mkdir -p "$WORK/pack" && cp "$WORK/steps.tsv" "$WORK/pack/summary.md"; }
  tar -C "$WORK" -czf "$WORK/pack/logs.tar.gz" logs metrics notes steps.tsv 2>/dev/null
  local f
  for f in results.json summary.md log_tails.txt kernels.json logs.tar.gz; do
    [ -f "$WORK/pack/$f" ] && cp "$WORK/pack/$f" "$DEST/.$f.tmp" && mv -f "$DEST/.$f.tmp" "$DEST/$f"
  done
}
PY_REPORT="$(command -v "$PY" || command -v python3 || echo false)"
[ "$DRY" = 1 ] && PY_REPORT="$(command -v python3 || echo false)"

record() { # id phase title status rc seconds cap note
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$WORK/steps.tsv"
}
# step ID PHASE NEED_S CAP_S TITLE FUNCTION [ARGS...]: not started when the budget left is
# under NEED_S (the time it usually takes); killed at CAP_S or the budget's end.
step() {
  local id="$1" ph="$2" need="$3" cap="$4" title="$5"
  shift 5
  local left=$((DEADLINE_S - RESERVE_S - EPOCHSECONDS)) rc status note secs
  if [ "$left" -lt "$need" ]; then
    record "$id" "$ph" "$title" SKIP - 0 "$cap" "not started: needs ~${need}s, ${left}s of the budget left"
    echo "== [$id] $title: SKIP (${left}s left, needs ~${need}s)"
    return
  fi
  local t=$((cap < left ? cap : left)) t0=${EPOCHREALTIME/./}
  echo "== [$id] $title (cap ${t}s; ${left}s of the budget left)"
  # A fresh bash under `timeout` leads a process group; what of it outlives the step is killed,
  # so it cannot hold the GPU through the steps after it.
  STEP_ID="$id" STEP_TIMEOUT="$t" timeout -k 10 "$t" bash -c '"$@"' _ "$@" >"$LOGS/$id.log" 2>&1 &
  local tp=$!
  wait "$tp"
  rc=$?
  kill -KILL -- "-$tp" 2>/dev/null
  secs=$(awk -v a="$t0" -v b="${EPOCHREALTIME/./}" 'BEGIN {printf "%.1f", (b - a) / 1e6}')
  case "$rc" in 0) status=PASS ;; 124 | 137) status=TIMEOUT ;; *) status=FAIL ;; esac
  note="$(head -c 400 "$WORK/notes/$id" 2>/dev/null | tr '\t\n|' '  /')"
  [ "$status" != PASS ] && [ -z "${note// /}" ] &&
    note="$(grep -v '^[[:space:]]*$' "$LOGS/$id.log" | tail -n 1 | cut -c1-160 | tr '\t|' ' /')"
  if [ "$status" = TIMEOUT ] && [ "$t" -lt "$cap" ]; then # the budget's end, not its own cap
    status=SKIP note="cut at the budget's end after ${t}s (its cap: ${cap}s)"
  elif [ "$status" = TIMEOUT ]; then
    note="killed at its cap, ${t}s${note:+; $note}"
  fi
  record "$id" "$ph" "$title" "$status" "$rc" "$secs" "$t" "$note"
  echo "   $status (rc $rc) in ${secs}s${note:+: $note}"
  report 0 >/dev/null 2>&1
}

# ---------------------------------------------------------------------------------------------
# The phases.

short() { echo "$1" | sed 's/^vit_//; s/_patch/_p/; s/_224$//'; }

phase_verify() {
  local b bins=() name
  for b in "$BIN"/test_cuda_*; do [ -x "$b" ] && bins+=("$(basename "$b")"); done
  [ "${#bins[@]}" -gt 0 ] || bins=(test_cuda_ops) # its step then says it is missing
  # The op and flash tests first (what everything else rests on), the model's after them.
  for name in test_cuda_ops test_cuda_flash_attention test_cuda_model; do
    [[ " ${bins[*]} " == *" $name "* ]] && step "t_${name#test_cuda_}" verify 30 180 \
      "$name, VIT_REQUIRE_GPU=1" s_gtest "$name" ""
  done
  for name in "${bins[@]}"; do
    case "$name" in test_cuda_ops | test_cuda_flash_attention | test_cuda_model) continue ;; esac
    step "t_${name#test_cuda_}" verify 15 120 "$name, VIT_REQUIRE_GPU=1" s_gtest "$name" ""
  done
  step m_ops verify 60 150 "memcheck: test_cuda_ops $MEMCHECK_FILTER" \
    s_memcheck test_cuda_ops "$MEMCHECK_FILTER"
  [[ " ${bins[*]} " == *" test_cuda_flash_attention "* ]] &&
    step m_flash verify 40 120 "memcheck: test_cuda_flash_attention *MatchesTheEmulation*" \
      s_memcheck test_cuda_flash_attention '*MatchesTheEmulation*'
  step r_recipe verify 30 240 "train $(basename "$RECIPE") --device $DEVICE (the default recipe)" \
    s_recipe
  step v_timm_load verify 40 150 "timm vit_small_patch16_224 (token) loads a vitrain export" \
    s_timm_load
}

# vitrain, then timm, per model (ViT-S/16 first: it decides the most); then the locality FFN;
# then a second vitrain sample per model where time is left (the report takes the median).
phase_speed() {
  local mbs m b s
  for mbs in $SPEED_MODELS; do
    IFS=: read -r m b s <<<"$mbs"
    step "s_vitrain_$(short "$m")" speed 20 120 "vitrain bench $m b$b, autotune on" \
      s_vbench vitrain "$m" "$b" "$s"
    step "s_timm_$(short "$m")" speed 90 240 "timm $m b$b: $TIMM_MODES" s_timm "$m" "$b"
    if [ "$m" = vit_small_patch16_224 ]; then
      step "s_local_$(short "$m")" speed 20 120 "vitrain bench $m b$b --ffn local" \
        s_vbench vitrain-local "$m" "$b" "$s" --ffn local
    fi
  done
  for mbs in $SPEED_MODELS; do
    IFS=: read -r m b s <<<"$mbs"
    step "s_vitrain2_$(short "$m")" speed 20 120 "vitrain bench $m b$b, second sample" \
      s_vbench vitrain "$m" "$b" "$s"
  done
}

phase_nccl() {
  if [ -f "$ROOT/scripts/gpu_check_nccl.sh" ]; then
    step n_two_ranks nccl 60 300 "NCCL: two ranks on one GPU (scripts/gpu_check_nccl.sh)" s_nccl
  else
    record n_two_ranks nccl "NCCL: two ranks on one GPU" SKIP - 0 0 "scripts/gpu_check_nccl.sh does not exist yet"
  fi
}

# The presets' rows that apply to MODEL (or MODEL+local) as NAME:KERNELS words.
presets_for() {
  local key="$1" all="$2" name kernels models
  while IFS=$'\t' read -r name kernels models _; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    [ "$kernels" = - ] && kernels=""
    if [[ ",$models," == *",$key,"* ]] || { [ "$models" = all ] && [ "$all" = 1 ]; }; then
      printf '%s:%s\n' "$name" "$kernels"
    fi
  done <"$PRESETS"
}
phase_plan() {
  step p_plan plan 20 150 "the device's plan: train --kernels autotune=on, 200 updates" s_plan
  local mbs m b s key flags variants
  for mbs in $SPEED_MODELS; do
    IFS=: read -r m b s <<<"$mbs"
    for key in "$m" "$m+local"; do
      flags="" && [ "$key" != "$m" ] && flags="--ffn local"
      mapfile -t variants < <(presets_for "$key" "$([ "$key" = "$m" ] && echo 1)")
      [ "${#variants[@]}" -gt 1 ] || continue
      step "p_variants_$(short "$m")${flags:+_local}" plan 60 240 \
        "bench --variant ${variants[*]%%:*}: $key b$b, $ROUNDS rounds" \
        s_variants "$m" "$b" "$(((s + 2) / 3))" "$flags" "${variants[@]}"
    done
  done
}

# Time to accuracy: vitrain's side is verify's recipe run where it passed in this call.
phase_tta() {
  if ! grep -qE $'^r_recipe\t[^\t]*\t[^\t]*\tPASS\t' "$WORK/steps.tsv"; then
    step tt_vitrain tta 30 240 "train $(basename "$RECIPE") --device $DEVICE (time to accuracy)" \
      s_train fmnist_tta
  fi
  step tt_torch tta 60 300 "bench/torch_fmnist_loop.py: $(basename "$RECIPE") in PyTorch" \
    s_torch_loop
}

step a_info verify 5 60 "GPU, driver, CUDA, cuBLASLt, PyTorch, timm, bundle" s_info
want verify && phase_verify
want speed && phase_speed
want nccl && phase_nccl
want plan && phase_plan
want tta && phase_tta

report 1
echo
echo "gpu_check: $(find "$DEST" -maxdepth 1 -type f | wc -l) files in $DEST:" && ls -la "$DEST"
# The end of the output is what the device tool's reply shows: the summary, failures' tails.
echo
cat "$WORK/pack/console.txt" 2>/dev/null || cat "$DEST/summary.md"
failed=0
grep -qE $'\t(FAIL|TIMEOUT)\t' "$WORK/steps.tsv" && failed=1
[ "${GPU_CHECK_KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
exit "$failed"
