#!/usr/bin/env python3
"""scripts/gpu_check_report.py on a made-up work dir: what a GPU session's reply shows is right
before a session depends on it. Steps of each status, a bench pair, interleaved variants with
and without kernel_calls, a failing step's log; checks the verdict, the counts, the speed ratio,
the variants' "opt-in kernels" column and the console's failure tail. Exits non-zero on a miss."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "scripts", "gpu_check_report.py")

STEPS = [  # id, group, title, status, rc, seconds, timeout, note
    ("a_info", "info", "GPU, driver", "PASS", "0", "0.5", "60", ""),
    ("b_flash", "ops", "fused flash attention vs CPU", "FAIL", "1", "12.0", "120", ""),
    ("f_vitrain_small_p16_r1", "bench", "vitrain bench", "PASS", "0", "9.0", "120",
     "graph replays: 20 of 20 timed passes"),
    ("t_eager_small_p16_r1", "bench", "timm eager", "PASS", "0", "20.0", "120", ""),
    ("v_variants_small_p16", "bench", "vitrain bench --variant", "PASS", "0", "60.0", "240", ""),
    ("g_compile_small_p16", "compile", "timm compile", "SKIP", "-", "0", "320",
     "not started: 40s of the budget left"),
]
RESULTS = {
    "a_info": None,
    "f_vitrain_small_p16_r1": {"impl": "vitrain-cuda", "model": "vit_small_patch16_224",
                               "batch": 256, "img_per_s": 9500.0, "ms_per_step": 26.95,
                               "mfu": 0.2654, "median_img_per_s": 9510.0,
                               "chunk_img_per_s": [9400.0, 9510.0, 9600.0],
                               "kernel_calls": {"sm90_gemm": 0, "cudnn_forward": 24}},
    "t_eager_small_p16_r1": {"impl": "timm-eager", "model": "vit_small_patch16_224",
                             "batch": 256, "img_per_s": 5700.0, "ms_per_step": 44.9},
}
VARIANTS = [
    {"impl": "vitrain", "model": "vit_small_patch16_224", "batch": 256, "variant": "default",
     "env": {}, "img_per_s_rounds": [9500.0, 9520.0, 9480.0], "median_img_per_s": 9500.0,
     "ratio_to_first": 1.0, "mfu": 0.2654,
     "kernel_calls": {"sm90_gemm": 0, "cudnn_forward": 0, "cudnn_backward": 0},
     "graph_replays": 60, "timed_passes": 60},
    {"impl": "vitrain", "model": "vit_small_patch16_224", "batch": 256, "variant": "cudnn",
     "env": {"VIT_CUDNN_ATTENTION": "1"}, "img_per_s_rounds": [10400.0, 10450.0, 10420.0],
     "median_img_per_s": 10420.0, "ratio_to_first": 1.0968, "mfu": 0.2911,
     "kernel_calls": {"sm90_gemm": 0, "cudnn_forward": 24, "cudnn_backward": 24},
     "graph_replays": 40, "timed_passes": 60},
    # a variant whose first run threw: no rates, no median or ratio, and why
    {"impl": "vitrain", "model": "vit_small_patch16_224", "batch": 256, "variant": "fusedbwd",
     "env": {"VIT_FLASH_FUSED_BWD": "1"}, "img_per_s_rounds": [],
     "kernel_calls": {"sm90_gemm": 0}, "graph_replays": 0, "timed_passes": 0,
     "error": "CUDA error: too many resources requested for launch | in flash_mma_backward"},
    # a host run's line: no kernel_calls, so no column text
    {"impl": "vitrain", "model": "vit_small_patch16_224", "batch": 256, "variant": "sm90",
     "env": {"VIT_SM90_GEMM": "1"}, "img_per_s_rounds": [9000.0], "median_img_per_s": 9000.0,
     "ratio_to_first": 0.9474},
]
FAIL_LOG = ["[ RUN      ] FlashAttentionBf16.Forward", "worst element 3 of 1024 beyond tolerance",
            "[  FAILED  ] FlashAttentionBf16.Forward (12 ms)"]


def make_work_dir(work):
    for d in ("logs", "metrics", "notes"):
        os.makedirs(os.path.join(work, d))
    with open(os.path.join(work, "steps.tsv"), "w") as f:
        for s in STEPS:
            f.write("\t".join(s) + "\n")
    with open(os.path.join(work, "metrics", "a_info.kv"), "w") as f:
        f.write("gpu=NVIDIA H200\nbundle_commit=0123456789abcdef\n")
    for sid, result in RESULTS.items():
        if result:
            with open(os.path.join(work, "metrics", sid + ".json"), "w") as f:
                f.write(json.dumps(result) + "\n")
    with open(os.path.join(work, "metrics", "v_variants_small_p16.variants"), "w") as f:
        f.writelines(json.dumps(v) + "\n" for v in VARIANTS)
    with open(os.path.join(work, "logs", "b_flash.log"), "w") as f:
        f.write("\n".join(FAIL_LOG) + "\n")


def row_of(text, *cells):
    """The table row holding all these cells."""
    return next((line for line in text.splitlines()
                 if line.startswith("|") and all(c in line for c in cells)), None)


def main():
    misses = []

    def expect(ok, what):
        if not ok:
            misses.append(what)

    with tempfile.TemporaryDirectory() as work:
        make_work_dir(work)
        subprocess.run([sys.executable, REPORT, work, "session", "0", "570", "1"], check=True)
        summary = open(os.path.join(work, "pack", "summary.md")).read()
        console = open(os.path.join(work, "pack", "console.txt")).read()
        results = json.load(open(os.path.join(work, "pack", "results.json")))

    expect(summary.startswith("# gpu_check session: FAIL"), "the verdict line: " +
           summary.splitlines()[0])
    expect(results["counts"] == {"PASS": 4, "FAIL": 1, "TIMEOUT": 0, "SKIP": 1},
           f"the counts: {results['counts']}")
    expect("NVIDIA H200" in summary and "0123456789ab" in summary, "the machine and bundle")
    # vitrain against timm eager: 9500 / 5700
    expect(row_of(summary, "vit_small_patch16_224", "1.67x timm-eager") is not None,
           "the medians' ratio to timm eager")
    run = row_of(summary, "f_vitrain_small_p16_r1", "9500.0")
    expect(run is not None and "| cudnn_forward 24 |" in run, f"a bench run's opt-in kernels: {run}")
    timm = row_of(summary, "t_eager_small_p16_r1", "5700.0")
    expect(timm is not None and "none" not in timm, f"timm's row has no kernel counts: {timm}")
    cudnn = row_of(summary, "| cudnn |")
    expect(cudnn is not None and "VIT_CUDNN_ATTENTION=1" in cudnn and "1.097x" in cudnn and
           "cudnn_forward 24, cudnn_backward 24" in cudnn, f"the cudnn variant's row: {cudnn}")
    expect(cudnn is not None and "| 40/60 |" in cudnn, f"the cudnn row's graph replays: {cudnn}")
    default = row_of(summary, "| default |")
    expect(default is not None and "| none |" in default and "| 60/60 |" in default,
           f"the default's row: {default}")
    failed = row_of(summary, "| fusedbwd |")
    expect(failed is not None and "FAILED: CUDA error: too many resources" in failed and
           "0.000x" not in failed and "/ in flash_mma_backward" in failed,
           f"a failed variant's row (why, no ratio, no stray column bar): {failed}")
    host = row_of(summary, "| sm90 |")
    expect(host is not None and "0.947x" in host and "| none |" not in host,
           f"a row without kernel_calls: {host}")
    expect(row_of(summary, "g_compile_small_p16", "SKIP", "40s of the budget left") is not None,
           "the skipped step and why")
    # the console: the failure's log tail before the table, and the whole table
    tail_at, table_at = console.find("--- b_flash"), console.find("# gpu_check session")
    expect(0 <= tail_at < table_at, "the failure's tail first in the console")
    expect(FAIL_LOG[-1] in console, "the failing test's last log line in the console")
    expect(console.rstrip().endswith(summary.split("\n### ")[0].rstrip().splitlines()[-1]),
           "the console ends with the summary's last table row")
    for m in misses:
        print("gpu_check_report_test: MISS:", m)
    print(f"gpu_check_report_test: {len(misses)} misses")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
