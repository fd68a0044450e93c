#!/usr/bin/env bash
# The commands of a dry run of scripts/gpu_check.sh (GPU_CHECK_DRY=1 or `gpu_check.sh dry`): it
# links this file under each command's name (vitrain, test_cuda_*, nvidia-smi,
# compute-sanitizer, timm_bench, timm_load_check, torch_fmnist_loop), and it answers as that
# command would, in the output formats gpu_check.sh and its report read: gtest's summary lines,
# vitrain's train lines and run folder (kernels.json), bench's --json lines (the kernel plan's
# "kernels" field, --variant lines), the lines of bench/timm_bench.py, bench/timm_load_check.py
# and bench/torch_fmnist_loop.py. The figures are made up. GPU_CHECK_STUB_FAIL: a regex over
# "COMMAND ARGS..."; a matching call fails (for bench --variant: the variants it names).
set -uo pipefail
cmd="$(basename "$0")"
all="$cmd $*"
fails() { [ -n "${GPU_CHECK_STUB_FAIL:-}" ] && [[ "$1" =~ $GPU_CHECK_STUB_FAIL ]]; }
arg() { # the value after flag $1 in the rest of the arguments ("" if none)
  local f="$1"
  shift
  while [ $# -gt 1 ]; do [ "$1" = "$f" ] && echo "$2" && return; shift; done
}
rate() { # a made-up img/s for model $1, scaled by $2
  local base
  case "$1" in
    vit_small_patch16_224) base=9500 ;; vit_base_patch16_224) base=3100 ;;
    vit_tiny_patch4_32) base=52000 ;; *) base=1000 ;;
  esac
  awk -v b="$base" -v s="$2" 'BEGIN {printf "%.2f", b * s}'
}
plan='[{"op":"attention","shape":"B256 N197 H6 D64","variant":"flash_mma_w4","why":"rule"},'
plan+='{"op":"matmul","shape":"50432x1152x384","variant":"cublaslt_algo3","why":"tuned"}]'

case "$cmd" in
  nvidia-smi)
    if [[ "$*" == *--query-gpu* ]]; then
      echo "NVIDIA Dry-Run GPU, 000.00, 81559 MiB, 9.0"
    else
      echo "| NVIDIA-SMI 000.00   Driver Version: 000.00   CUDA Version: 13.0 |"
    fi
    ;;
  compute-sanitizer)
    [ "${1:-}" = --version ] && echo "Compute Sanitizer (dry-run stub)" && exit 0
    while [[ "${1:-}" == --* ]]; do shift 2; done # --tool memcheck --error-exitcode 99 ...
    "$@"
    rc=$?
    echo "========= ERROR SUMMARY: 0 errors"
    exit "$rc"
    ;;
  test_cuda_*)
    echo "[==========] 3 tests from 1 test suite ran. (1 ms total)"
    if fails "$all"; then
      echo "[  PASSED  ] 2 tests."
      echo "[  FAILED  ] 1 test, listed below:"
      echo "[  FAILED  ] Stub.FailsOnPurpose"
      exit 1
    fi
    echo "[  PASSED  ] 3 tests."
    ;;
  vitrain)
    sub="${1:-}"
    shift
    fails "$all" && [ "$sub" != bench ] && echo "error: stub: $sub failed on purpose" >&2 && exit 1
    if [ "$sub" = train ]; then
      run="$(arg --output "$@")/$(arg --experiment "$@")"
      mkdir -p "$run"
      echo "{\"options\":\"$(arg --kernels "$@")\",\"plan\":$plan}" >"$run/kernels.json"
      echo 'model: "vit_fmnist_hybrid"' >"$run/args.yaml"
      printf 'epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s\n' \
        >"$run/summary.csv"
      printf '0,0.9,0.5,88.10,99.5,1e-3,28,11.2,5357.1\n' >>"$run/summary.csv"
      echo "Final test top-1: 88.10%  top-5: 99.50%  loss: 0.5000  (11 s of training)"
      echo "Run folder: $run"
      exit 0
    fi
    [ "$sub" = bench ] || { echo "error: stub: no vitrain $sub" >&2 && exit 2; }
    model="$(arg --model "$@")" batch="$(arg -b "$@")" rc=0 first=""
    opts="$(arg --kernels "$@")"
    if [[ "$*" != *--variant* ]]; then
      scale=1 && [[ "$*" == *"--ffn local"* ]] && scale=0.93
      r=$(rate "$model" "$scale")
      echo "{\"impl\":\"vitrain-cuda\",\"model\":\"$model\",\"batch\":$batch,\"img_per_s\":$r,\"ms_per_step\":$(awk -v r="$r" -v b="$batch" 'BEGIN {printf "%.2f", 1e3 * b / r}'),\"median_img_per_s\":$r,\"chunk_img_per_s\":[$r,$r,$r],\"mfu\":0.2650,\"kernels\":{\"options\":\"$opts\",\"plan\":$plan}}"
      exit 0
    fi
    for ((i = 1; i <= $#; i++)); do
      [ "${!i}" = --variant ] || continue
      j=$((i + 1)) && spec="${!j}" && name="${spec%%:*}" kern="${spec#*:}"
      if fails "variant $name"; then
        echo "error: bench: variant $name failed: stub failure on purpose" >&2
        echo "{\"impl\":\"vitrain\",\"model\":\"$model\",\"batch\":$batch,\"variant\":\"$name\",\"kernels\":{\"options\":\"$kern\",\"plan\":[]},\"img_per_s_rounds\":[],\"error\":\"stub failure on purpose\"}"
        rc=1 && continue
      fi
      scale=$(awk -v n="${#name}" 'BEGIN {printf "%.3f", 0.97 + 0.01 * (n % 6)}')
      r=$(rate "$model" "$scale") && first="${first:-$r}"
      echo "{\"impl\":\"vitrain\",\"model\":\"$model\",\"batch\":$batch,\"variant\":\"$name\",\"kernels\":{\"options\":\"$kern\",\"plan\":$plan},\"img_per_s_rounds\":[$r,$r,$r],\"median_img_per_s\":$r,\"ratio_to_first\":$(awk -v a="$r" -v b="$first" 'BEGIN {printf "%.4f", a / b}'),\"mfu\":0.2600,\"graph_replays\":60,\"timed_passes\":60}"
    done
    exit "$rc"
    ;;
  timm_bench)
    model="$(arg --model "$@")" batch="$(arg --batch "$@")" modes="$(arg --modes "$@")"
    for mode in ${modes//,/ }; do
      name="timm-compile-$mode" && [ "$mode" = eager ] && name=timm-eager
      head="\"impl\":\"timm\",\"name\":\"$name\",\"mode\":\"$mode\",\"model\":\"$model\",\"batch\":$batch"
      if [[ "$mode" == max-autotune* ]]; then # what a compile over its cap reports
        echo "{$head,\"status\":\"not compiled within $(arg --compile-cap "$@") s\"}"
        continue
      fi
      scale=0.6 && [ "$mode" != eager ] && scale=0.9
      r=$(rate "$model" "$scale")
      echo "{$head,\"status\":\"ok\",\"img_per_s\":$r,\"chunk_img_per_s\":[$r,$r,$r],\"timed_s\":3.2,\"mfu\":0.1700}"
    done
    ;;
  timm_load_check) # bench/timm_load_check.py's JSON line and stderr summary
    ok=true && fails "$all" && ok=false
    res=""
    for p in fp32 bf16; do
      rel=3.1e-07 && [ "$p" = bf16 ] && rel=0.0042
      [ "$ok" = false ] && [ "$p" = fp32 ] && rel=0.31
      res+="${res:+, }{\"precision\": \"$p\", \"pass\": $ok, \"rel_l2\": $rel, \"max_abs_frac\": 0.001, \"top1_agree\": 1.0, \"loader\": \"timm vit_small_patch16_224\"}"
      echo "timm_load_check: timm vit_small_patch16_224, vitrain $p: rel L2 $rel: $([ "$ok" = true ] && echo pass || echo FAIL)" >&2
    done
    echo "{\"check\": \"timm_load\", \"pass\": $ok, \"model\": \"vit_small_patch16_224\", \"classifier\": \"token\", \"export_architecture\": \"vit_tiny_patch16_224\", \"images\": 16, \"loaders\": [\"timm vit_small_patch16_224\"], \"load_errors\": {}, \"results\": [$res], \"timm\": \"0.0.stub\"}"
    [ "$ok" = true ]
    ;;
  torch_fmnist_loop) # bench/torch_fmnist_loop.py: a line an epoch, then the summary line
    fails "$all" && echo "torch_fmnist_loop: stub failure on purpose" >&2 && exit 1
    top1=(85.9 88.2 89.5 90.4 91.0 91.3)
    for e in 0 1 2 3 4 5; do
      echo "{\"impl\": \"torch-loop\", \"epoch\": $e, \"top1\": ${top1[e]}, \"elapsed_s\": $((9 * e + 9)).5, \"train_s\": $((9 * e + 8))}"
    done
    echo "{\"impl\": \"torch-loop\", \"final\": true, \"model\": \"vit_fmnist_hybrid\", \"device\": \"$(arg --device "$@")\", \"epochs\": 6, \"batch\": 64, \"top1_final\": 91.3, \"top1_best\": 91.3, \"loop_s\": 54.5, \"setup_s\": 6.2, \"torch\": \"0.0.stub\"}"
    ;;
  *) echo "gpu_check_stub: no stub for $cmd" >&2 && exit 2 ;;
esac
