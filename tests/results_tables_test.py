#!/usr/bin/env python3
"""scripts/results_tables.py on made-up artefacts in a temp dir: `wrap` turns a run folder's
summary.csv + args.yaml into results.json; --write fills the README and benchmark blocks (a
CPU training run, a gpu_check.sh results.json with vitrain, timm eager and torch.compile rounds,
and a headline with no artefact); --check passes on the written text, fails with one line on a
stale number, and a removed artefact turns its row into "not yet measured at this commit".
Exits non-zero on a miss."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "scripts", "results_tables.py")
NOT_MEASURED = "not yet measured at this commit"

misses = []


def expect(cond, what):
    if not cond:
        misses.append(what)


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def read(path):
    return open(path).read()


SUMMARY = ("epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s,budget_s,fraction\n"
           "0,1.0,0.5,88.10,99.0,1e-3,28,70.00,900.00,0.00,0.5\n"
           "1,0.8,0.4,90.25,99.5,1e-5,28,141.50,800.00,0.00,1.0\n")
ARGS = 'model: "vit_fmnist_hybrid"\nexperiment: "made_up"\nepochs: 2\ndevice: "cpu"\n'
GPU_CHECK = {
    "phase": "all", "overall": "PASS", "started": "2000-01-01T00:00:00Z",
    "system": {"gpu": "Made-up GPU", "driver": "1.2", "cuda_driver_api": "12.0",
               "nvcc": "12.0", "torch": "2.0", "timm": "1.0", "bundle_commit": "0123abc"},
    "bench": [
        {"impl": "vitrain-cuda", "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 9000.0},
        {"impl": "vitrain-cuda", "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 9400.0},
        {"impl": "vitrain-cuda", "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 9200.0},
        {"impl": "vitrain-cuda-unfused", "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 5000.0},
        {"impl": "timm-eager", "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 4600.0},
        {"impl": "timm-compile", "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 8000.0},
    ],
    "steps": [],
}
# The schema as scripts/gpu_check.sh writes it now: figures with names and its own ratios.
GPU_CHECK_NEW = {
    "schema": "vitrain-results/1", "what": "gpu_check.sh session", "commit": "0123abc",
    "date": "2000-01-01", "device": {"kind": "cuda", "name": "Made-up GPU", "driver": "1.2"},
    "versions": {"torch": "2.0"}, "source": "scripts/gpu_check_report.py",
    "log_tail": "log_tails.txt", "verdict": "PASS",
    "figures": [
        {"kind": "bench", "name": "vitrain", "impl": "vitrain", "model": "vit_small_patch16_224",
         "batch": 256, "img_per_s": 9200.0, "status": "ok",
         "ratio_to": {"timm-eager": 2.0, "timm-compile-default": 1.1, "timm-compile-best": 1.15}},
        {"kind": "bench", "name": "timm-eager", "impl": "timm-eager",
         "model": "vit_small_patch16_224", "batch": 256, "img_per_s": 4600.0, "status": "ok"},
        {"kind": "bench", "name": "timm-compile-max-autotune-no-cudagraphs", "model": "vit_small_patch16_224",
         "batch": 256, "img_per_s": None, "status": "not compiled within 150 s"},
        {"kind": "variant", "name": "tuned", "model": "vit_small_patch16_224", "batch": 256,
         "img_per_s": 9300.0, "status": "ok"},
        {"kind": "train", "run": "r_recipe", "model": "vit_fmnist_hybrid", "recipe": "fmnist",
         "device": "cuda", "epochs": 6, "top1_final": 91.5, "top1_best": 91.6, "wall_s": 7.9,
         "img_per_s": 70000.0, "file": None},
    ],
}
README = "# made up\n\n<!-- results:readme begin -->\nold text\n<!-- results:readme end -->\n\ntail\n"
BENCH = "".join(f"<!-- results:{n} begin -->\n<!-- results:{n} end -->\n\n"
                for n in ("train", "bench", "provenance"))

with tempfile.TemporaryDirectory() as root:
    runs = os.path.join(root, "docs", "runs")
    write(os.path.join(root, "README.md"), README)
    write(os.path.join(root, "docs", "benchmarks.md"), BENCH)
    write(os.path.join(runs, "fmnist_default", "seed1", "summary.csv"), SUMMARY)
    write(os.path.join(runs, "fmnist_default", "seed1", "args.yaml"), ARGS)
    write(os.path.join(runs, "1999-12-31-gpu-check", "results.json"), json.dumps(GPU_CHECK))
    write(os.path.join(runs, "2000-01-01-gpu-check", "results.json"), json.dumps(GPU_CHECK_NEW))

    rc, out = run("wrap", os.path.join(runs, "fmnist_default"), "--what", "made-up run",
                  "--device", "cpu", "--device-name", "Made-up CPU", "--commit", "feedbee")
    expect(rc == 0, f"wrap failed: {out}")
    res = json.load(open(os.path.join(runs, "fmnist_default", "results.json")))
    fig = res["figures"][0]
    expect(res["schema"] == "vitrain-results/1" and res["commit"] == "feedbee", "wrap: header")
    expect((fig["top1_final"], fig["top1_best"], fig["wall_s"], fig["img_per_s"], fig["epochs"])
           == (90.25, 90.25, 141.5, 850.0, 2), f"wrap: figure {fig}")
    expect(fig["model"] == "vit_fmnist_hybrid" and fig["file"] == "seed1/summary.csv", "wrap: names")

    rc, out = run("--check", "--root", root)
    expect(rc == 1 and "README.md (readme)" in out and len(out.strip().splitlines()) == 1,
           f"--check on blocks never written: rc {rc}, {out!r}")
    rc, out = run("--write", "--root", root)
    expect(rc == 0, f"--write failed: {out}")
    rc, out = run("--check", "--root", root)
    expect(rc == 0, f"--check right after --write: rc {rc}, {out!r}")

    readme = read(os.path.join(root, "README.md"))
    lines = readme.splitlines()
    row = next((l for l in lines if "`vit_fmnist_hybrid`" in l and "Default recipe" in l), "")
    expect("| 850 |" in row and "| 90.25 |" in row and "Made-up CPU" in row and "142 s" in row,
           f"README train row: {row!r}")
    small = next((l for l in lines if "`vit_small_patch16_224`" in l), "")
    # the device check's own ratios: timm eager and the fastest torch.compile mode
    expect("| 9,200 | 2.00 | 1.15 |" in small, f"README bench row: {small!r}")
    expect("2000-01-01-gpu-check" in small, f"the newest gpu-check artefact: {small!r}")
    gpu = next((l for l in lines if "Default recipe on the GPU" in l), "")
    expect("| 91.50 |" in gpu and "Made-up GPU" in gpu, f"README GPU recipe row: {gpu!r}")
    base = next((l for l in lines if "`vit_base_patch16_224`" in l), "")
    expect(NOT_MEASURED in base, f"README row with no artefact: {base!r}")
    expect(NOT_MEASURED in next((l for l in lines if "30-minute" in l), ""), "30m row: no artefact")
    expect("old text" not in readme and readme.endswith("tail\n"), "README outside the block")
    bench = read(os.path.join(root, "docs", "benchmarks.md"))
    expect("| variant tuned |" in bench and "| not compiled within 150 s |" in bench,
           "benchmarks: variants and a figure without img/s")

    # The older gpu_check format: its rounds' median over timm eager and compile, same run.
    os.rename(os.path.join(runs, "2000-01-01-gpu-check"), os.path.join(root, "newer"))
    run("--write", "--root", root)
    small = next((l for l in read(os.path.join(root, "README.md")).splitlines()
                  if "`vit_small_patch16_224`" in l), "")
    expect("| 9,200 | 2.00 | 1.15 |" in small and "1999-12-31-gpu-check" in small,
           f"README bench row from the older format: {small!r}")
    expect("| vitrain-cuda-unfused |" in read(os.path.join(root, "docs", "benchmarks.md")),
           "benchmarks: an older-format variant keeps its name")
    os.rename(os.path.join(root, "newer"), os.path.join(runs, "2000-01-01-gpu-check"))
    run("--write", "--root", root)
    expect("feedbee" in bench and "0123abc" in bench, "benchmarks: provenance commits")

    # A stale number: the artefact changes, the committed text does not.
    p = os.path.join(runs, "fmnist_default", "results.json")
    res["figures"][0]["top1_final"] = 91.0
    write(p, json.dumps(res))
    rc, out = run("--check", "--root", root)
    expect(rc == 1 and "stale" in out and "README.md (readme)" in out
           and "docs/benchmarks.md (train)" in out, f"--check on a stale number: {rc}, {out!r}")

    # A missing artefact: its README row says so after --write.
    os.remove(p)
    rc, out = run("--write", "--root", root)
    row = next((l for l in read(os.path.join(root, "README.md")).splitlines()
                if "Default recipe" in l), "")
    expect(rc == 0 and NOT_MEASURED in row and "90.25" not in row, f"missing artefact row: {row!r}")

    # A dry run's made-up figures are refused.
    write(os.path.join(runs, "dry", "results.json"), json.dumps(dict(GPU_CHECK_NEW, dry=True)))
    rc, out = run("--check", "--root", root)
    expect(rc == 2 and "dry" in out and "Traceback" not in out, f"dry artefact: {rc}, {out!r}")
    os.remove(os.path.join(runs, "dry", "results.json"))

    # Bad input: one line and a non-zero exit, no traceback.
    write(os.path.join(runs, "broken", "results.json"), "{not json")
    rc, out = run("--check", "--root", root)
    expect(rc == 2 and "broken" in out and "Traceback" not in out, f"bad JSON: {rc}, {out!r}")

for m in misses:
    print("MISS:", m)
print("results_tables_test:", "FAIL" if misses else "PASS")
sys.exit(1 if misses else 0)
