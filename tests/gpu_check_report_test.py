#!/usr/bin/env python3
"""scripts/gpu_check_report.py and scripts/gpu_check.sh without a GPU: what a device call's reply
and artefact show is right before a session depends on it. Exits non-zero on a miss.

  gpu_check_report_test.py         the report on a made-up work dir: the verdict and counts,
                                   figures {name, model, batch, img_per_s, mfu, ratio_to} from
                                   the plan-era bench lines and the old kernel_calls ones, a mode
                                   that did not compile, a failed variant, the checks against
                                   the issues' targets, the plan, the failure's tail first, the
                                   time-to-accuracy table, the export check's figures and checks
  gpu_check_report_test.py --dry   `gpu_check.sh dry` (stub commands) with a failing test binary
                                   and a failing variant, then with a budget too short for most
                                   steps, then the tta phase alone: the phases' order, each
                                   step's status, SKIP by budget, the tta and export figures"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
REPORT = os.path.join(ROOT, "scripts", "gpu_check_report.py")
PLAN = [{"op": "attention", "shape": "B256 N197", "variant": "flash_w4", "why": "rule"}]
STEPS = [  # id, phase, title, status, rc, seconds, cap, note
    ("a_info", "verify", "GPU, driver", "PASS", "0", "0.5", "60", ""),
    ("t_flash_attention", "verify", "flash tests", "FAIL", "1", "12.0", "180", ""),
    ("r_recipe", "verify", "train fmnist.yaml", "PASS", "0", "30.0", "240", "top-1 88.1%"),
    ("s_vitrain_small_p16", "speed", "vitrain bench", "PASS", "0", "9.0", "120", ""),
    ("s_timm_small_p16", "speed", "timm", "PASS", "0", "200.0", "420", ""),
    ("s_local_small_p16", "speed", "vitrain bench --ffn local", "PASS", "0", "9.0", "120", ""),
    ("s_vitrain2_small_p16", "speed", "vitrain bench", "PASS", "0", "9.0", "120", ""),
    ("n_two_ranks", "nccl", "NCCL", "SKIP", "-", "0", "0", "scripts/gpu_check_nccl.sh does not exist yet"),
    ("p_variants_small_p16", "plan", "bench --variant", "PASS", "0", "60.0", "240", ""),
    ("p_variants_tiny_p4_32", "plan", "bench --variant", "PASS", "0", "30.0", "240", ""),
    ("p_variants_base_p16", "plan", "bench --variant", "SKIP", "-", "0", "240",
     "not started: needs ~60s, 40s of the budget left"),
    ("v_timm_load", "verify", "timm loads a vitrain export", "FAIL", "1", "35.0", "150", ""),
    ("tt_torch", "tta", "torch_fmnist_loop.py", "PASS", "0", "40.0", "300", ""),
]
KV = {"a_info": "gpu=NVIDIA H200\ndriver=580.1\ncommit=0123456789abcdef\ntorch=2.9.0\n",
      "r_recipe": "top1=88.10\n", "s_vitrain_small_p16": "figure=vitrain\nsteps=120\n",
      "s_local_small_p16": "figure=vitrain-local\nsteps=120\n",
      "s_vitrain2_small_p16": "figure=vitrain\nsteps=120\n"}
S = {"model": "vit_small_patch16_224", "batch": 256}
LINES = {
    # the plan-era line (kernels) and an old one (kernel_calls): the report takes both
    "s_vitrain_small_p16": [dict(S, impl="vitrain-cuda", img_per_s=14900.0, median_img_per_s=15000.0,
                                 ms_per_step=17.0, mfu=0.419,
                                 kernels={"options": "attention=auto,gelu=erf,autotune=on,"
                                          "flash_warps=auto,embed=auto", "plan": PLAN})],
    "s_vitrain2_small_p16": [dict(S, impl="vitrain-cuda", img_per_s=14000.0, median_img_per_s=14000.0,
                                  ms_per_step=18.0, mfu=0.37, kernel_calls={"cudnn_forward": 24})],
    "s_local_small_p16": [dict(S, impl="vitrain-cuda", median_img_per_s=13000.0, ms_per_step=19.7,
                               mfu=0.36, kernels={"options": "autotune=on", "plan": PLAN})],
    "s_timm_small_p16": [
        dict(S, impl="timm", name="timm-eager", mode="eager", status="ok", img_per_s=6000.0, timed_s=3.1),
        dict(S, impl="timm", name="timm-compile-default", mode="default", status="ok",
             img_per_s=8000.0, timed_s=3.3, mfu=0.22),
        dict(S, impl="timm", name="timm-compile-reduce-overhead", mode="reduce-overhead",
             status="ok", img_per_s=9000.0, timed_s=2.4),
        dict(S, impl="timm", name="timm-compile-max-autotune-no-cudagraphs",
             mode="max-autotune-no-cudagraphs", status="not compiled within 150 s")],
    "p_variants_small_p16": [
        dict(S, impl="vitrain", variant="default", kernels={"options": "", "plan": PLAN},
             img_per_s_rounds=[14000.0, 14100.0, 13900.0], median_img_per_s=14000.0, ratio_to_first=1.0),
        dict(S, impl="vitrain", variant="tuned", kernels={"options": "autotune=on", "plan": PLAN},
             img_per_s_rounds=[13800.0, 13700.0, 13900.0], median_img_per_s=13800.0,
             ratio_to_first=0.9857, mfu=0.38),
        dict(S, impl="vitrain", variant="gelufast", env={"VIT_GELU_FAST": "1"},
             img_per_s_rounds=[], error="CUDA error: too many resources | in gelu")],
    # the time-to-accuracy loop: 88.1 (vitrain's final, below this one's) first reached at 15 s
    "tt_torch": [{"impl": "torch-loop", "epoch": 0, "top1": 87.0, "elapsed_s": 8.0},
                 {"impl": "torch-loop", "epoch": 1, "top1": 88.3, "elapsed_s": 15.0},
                 {"impl": "torch-loop", "epoch": 2, "top1": 88.6, "elapsed_s": 30.0},
                 {"impl": "torch-loop", "final": True, "top1_final": 88.6, "setup_s": 5.0,
                  "attention": "sdpa", "optimizer": "AdamW fused"}],
    # timm's load: fp32 matches, bf16 does not, timm's local-dir loader missing
    "v_timm_load": [{"check": "timm_load", "pass": False, "model": "vit_small_patch16_224",
                     "classifier": "token", "loaders": ["timm vit_small_patch16_224"],
                     "load_errors": {"timm local-dir": "RuntimeError: Unknown model"}, "results": [
                         {"loader": "timm vit_small_patch16_224", "precision": p, "pass": ok,
                          "rel_l2": rel, "max_abs_frac": 0.01, "top1_agree": 1.0,
                          "tolerance": {"rel_l2": tol}}
                         for p, ok, rel, tol in (("fp32", True, 2e-7, 1e-4), ("bf16", False, 0.05, 3e-2))]}],
    "p_variants_tiny_p4_32": [  # autotune on exactly as fast as off: it passes (>= 1.0x)
        dict(model="vit_tiny_patch4_32", batch=1024, variant=v, median_img_per_s=50000.0,
             ratio_to_first=1.0, kernels={"options": o}) for v, o in (("default", ""), ("tuned", "autotune=on"))]
    + [dict(model="vit_tiny_patch4_32", batch=1024, variant="old", median_img_per_s=50000.0,
            ratio_to_first=1.0, kernel_calls={"sm90_gemm": 0, "cudnn_forward": 24})],  # an old line
}
FAIL_LOG = ["[ RUN      ] FlashAttentionBf16.Forward", "worst element 3 of 1024 beyond tolerance",
            "[  FAILED  ] FlashAttentionBf16.Forward (12 ms)"]


def make_work_dir(work):
    for d in ("logs/r_recipe", "logs/p_plan", "metrics", "notes"):
        os.makedirs(os.path.join(work, d))
    with open(os.path.join(work, "steps.tsv"), "w") as f:
        f.writelines("\t".join(s) + "\n" for s in STEPS)
    for sid, text in KV.items():
        with open(os.path.join(work, "metrics", sid + ".kv"), "w") as f:
            f.write(text)
    for sid, rows in LINES.items():
        with open(os.path.join(work, "metrics", sid + ".jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(work, "logs", "p_plan", "kernels.json"), "w") as f:
        json.dump({"options": "autotune=on", "plan": PLAN}, f)
    with open(os.path.join(work, "logs", "r_recipe", "summary.csv"), "w") as f:
        f.write("epoch,train_loss,eval_loss,eval_top1,seconds,img_per_s\n0,1,1,88.5,10,5000\n"
                "1,1,1,88.10,21.5,5100\n")
    with open(os.path.join(work, "logs", "t_flash_attention.log"), "w") as f:
        f.write("\n".join(FAIL_LOG) + "\n")


def row_of(text, *cells):
    return next((line for line in text.splitlines()
                 if line.startswith("|") and all(c in line for c in cells)), None)


def report_checks(expect):
    with tempfile.TemporaryDirectory() as work:
        make_work_dir(work)
        subprocess.run([sys.executable, REPORT, work, "verify,speed,nccl,plan", "0", "540", "1", "0"],
                       check=True, env=dict(os.environ, GPU_CHECK_REF_TOP1="88.3"))
        pack = os.path.join(work, "pack")
        summary, console = (open(os.path.join(pack, n)).read() for n in ("summary.md", "console.txt"))
        res = json.load(open(os.path.join(pack, "results.json")))
        kernels = json.load(open(os.path.join(pack, "kernels.json")))
        tails = open(os.path.join(pack, "log_tails.txt")).read()
    expect(summary.startswith("# gpu_check verify,speed,nccl,plan: FAIL"), "verdict: " + summary[:60])
    expect(res["verdict"] == "FAIL" and res["schema"] == "vitrain-results/1" and not res["dry"],
           "results.json's verdict, schema and dry flag")
    expect(res["counts"] == {"PASS": 9, "FAIL": 2, "TIMEOUT": 0, "SKIP": 2}, f"counts {res['counts']}")
    expect(res["commit"] == "0123456789abcdef" and res["device"]["name"] == "NVIDIA H200",
           "the commit and device")
    figs = {(f["kind"], f.get("name")): f for f in res["figures"]
            if f["kind"] == "train" or f["model"] == "vit_small_patch16_224"}
    v = figs.get(("bench", "vitrain"), {})
    # two samples (15000, 14000): their median; over the fastest compiled mode (9000)
    expect(v.get("img_per_s") == 14500.0 and v.get("samples") == 2 and v.get("mfu") == 0.3945,
           f"vitrain's two samples: {v}")
    expect(v.get("ratio_to", {}).get("timm-compile-best") == round(14500 / 9000, 4) and
           v["ratio_to"].get("timm-eager") == round(14500 / 6000, 4) and
           "vitrain-local" not in v["ratio_to"], f"vitrain's ratio_to: {v.get('ratio_to')}")
    expect(v.get("timed_s") == 2.04 and v.get("kernels") == "autotune=on", f"timed_s, kernels: {v}")
    loc = figs.get(("bench", "vitrain-local"), {})
    expect(loc.get("ratio_to") == {"vitrain": round(13000 / 14500, 4)}, f"local's ratio: {loc}")
    ma = figs.get(("bench", "timm-compile-max-autotune-no-cudagraphs"), {})
    expect(ma.get("img_per_s") is None and ma.get("status") == "not compiled within 150 s",
           f"the mode that did not compile: {ma}")
    tuned, gf = figs.get(("variant", "tuned"), {}), figs.get(("variant", "gelufast"), {})
    expect(tuned.get("ratio_to") == {"default": 0.9857}, f"tuned's ratio: {tuned}")
    expect(gf.get("status", "").startswith("error: CUDA error") and gf.get("ratio_to") == {} and
           gf.get("kernels") == "VIT_GELU_FAST=1", f"the failed variant: {gf}")
    train = figs.get(("train", None), {})
    expect(train.get("top1_final") == 88.1 and train.get("top1_best") == 88.5 and
           train.get("wall_s") == 21.5, f"the recipe's train figure: {train}")
    by = {c["name"]: c["pass"] for c in res["checks"]}
    expect(by.get("vit_small_patch16_224: vitrain / fastest compiled timm mode") is True and
           by.get("vit_small_patch16_224: vitrain MFU of 989 TFLOP/s") is False and
           by.get("vit_base_patch16_224: vitrain MFU of 989 TFLOP/s") is None and
           by.get("vit_small_patch16_224: locality FFN / plain MLP") is False and
           by.get("vit_small_patch16_224: autotune on / off (bench --variant)") is False and
           by.get("vit_tiny_patch4_32: autotune on / off (bench --variant)") is True,
           f"the acceptance checks: {by}")
    expect(any(c["name"].startswith("seconds of timed steps") and c["value"] == 2.04 and
               c["pass"] is False for c in res["checks"]), f"the 3 s check: {res['checks']}")
    expect(any(c["name"].startswith("default recipe: top-1") and c["value"] == 0.1 for c in res["checks"]),
           "the recipe's top-1 against GPU_CHECK_REF_TOP1")
    tta = {f["name"]: f for f in res["figures"] if f["kind"] == "tta"}
    v, t = tta.get("vitrain", {}), tta.get("torch-loop", {})
    expect(v.get("step") == "r_recipe" and v.get("target_top1") == 88.1 and
           v.get("time_to_target_s") == 10.0 and v.get("ratio_to") == {"torch-loop": 1.5} and
           v.get("loop_s") == 21.5 and v.get("process_s") == 30.0, f"vitrain's time to accuracy: {v}")
    expect(t.get("top1_final") == 88.6 and t.get("time_to_target_s") == 15.0 and
           t.get("setup_s") == 5.0 and t.get("epochs") == 3, f"the PyTorch loop's: {t}")
    expect(not [f for f in res["figures"] if f["kind"] == "bench" and f["step"] in ("tt_torch", "v_timm_load")],
           "the loop's and the load check's lines are no bench figures")
    ex = {f["precision"]: f for f in res["figures"] if f["kind"] == "export"}
    expect(ex.get("fp32", {}).get("pass") is True and ex.get("bf16", {}).get("pass") is False,
           f"the export figures: {ex}")
    expect(by.get("ViT-S/16 token export: timm vit_small_patch16_224 loads it (strict)") is True and
           by.get("ViT-S/16 token export: timm vs vitrain eval fp32, logits rel L2") is True and
           by.get("ViT-S/16 token export: timm vs vitrain eval bf16, logits rel L2") is False,
           f"the export checks: {by}")
    expect(row_of(summary, "| torch-loop |", "88.3@15s") is not None and
           row_of(summary, "| vitrain |", "1.50x torch-loop") is not None, "the time-to-accuracy table")
    expect(row_of(summary, "eval bf16, logits rel L2", "<= 0.03", "NO") is not None,
           "a <= check's row")
    expect(res["plan"] == PLAN and kernels["plan"] == PLAN, "the plan and kernels.json")
    expect(res["bench_plans"] == {"vit_small_patch16_224": PLAN}, f"bench plans: {res['bench_plans']}")
    old = [f for f in res["figures"] if f.get("name") == "old"]
    expect(old and old[0]["kernels"] == "cudnn_forward 24", f"an old line's kernel_calls: {old}")
    row = row_of(summary, "| gelufast |")
    expect(row is not None and "FAILED: CUDA error: too many resources / in gelu" in row,
           f"the failed variant's row: {row}")
    row = row_of(summary, "| timm-compile-max-autotune-no-cudagraphs |")
    expect(row is not None and "not compiled within 150 s" in row, f"the uncompiled mode's row: {row}")
    expect(row_of(summary, "p_variants_base_p16", "SKIP", "40s of the budget left") is not None,
           "the skipped step and why")
    expect("===== t_flash_attention FAIL" in tails and FAIL_LOG[-1] in tails and
           "===== p_variants_base_p16" not in tails, "log_tails.txt")
    tail_at, table_at = console.find("--- t_flash_attention"), console.find("# gpu_check")
    expect(0 <= tail_at < table_at and FAIL_LOG[-1] in console, "the failure's tail first in the console")


def verdict_checks(expect):
    """The verdict from the statuses alone: any FAIL or TIMEOUT fails; SKIP or a call cut off
    (final 0) is INCOMPLETE."""
    for statuses, final, want in ((["PASS", "TIMEOUT"], "1", "FAIL"), (["PASS", "SKIP"], "1", "INCOMPLETE"),
                                  (["PASS"], "0", "INCOMPLETE"), (["PASS", "PASS"], "1", "PASS")):
        with tempfile.TemporaryDirectory() as work:
            os.makedirs(os.path.join(work, "logs"))
            with open(os.path.join(work, "steps.tsv"), "w") as f:
                f.writelines(f"x{i}\tverify\tt\t{st}\t0\t1.0\t10\t\n" for i, st in enumerate(statuses))
            subprocess.run([sys.executable, REPORT, work, "verify", "0", "540", final, "0"], check=True)
            got = json.load(open(os.path.join(work, "pack", "results.json")))["verdict"]
        expect(got == want, f"verdict of {statuses} (final {final}): {got}, not {want}")


def dry_run(dest, phases="dry", **env):
    script = os.path.join(ROOT, "scripts", "gpu_check.sh")
    p = subprocess.run(["bash", script, phases, dest], env=dict(os.environ, GPU_CHECK_DRY="1", **env),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout, json.load(open(os.path.join(dest, "results.json")))


def dry_checks(expect):
    with tempfile.TemporaryDirectory() as dest:
        rc, out, res = dry_run(dest, GPU_CHECK_STUB_FAIL="test_cuda_model|variant gelufast",
                               GPU_CHECK_BUDGET_S="540")
        files = sorted(os.listdir(dest))
    expect(rc == 1 and res["verdict"] == "FAIL" and res["dry"] and "DRY RUN" in res["what"],
           f"a failing dry run: rc {rc}, {res['verdict']}\n{out[-2000:]}")
    expect(files == ["kernels.json", "log_tails.txt", "logs.tar.gz", "results.json", "summary.md"],
           f"DEST's files: {files}")
    st = {s["id"]: s["status"] for s in res["steps"]}
    order = [s["phase"] for s in res["steps"]]
    expect(order == sorted(order, key=["verify", "speed", "nccl", "plan", "tta"].index),
           f"the phases' order: {order}")
    expect(st.get("t_model") == "FAIL" and st.get("p_variants_small_p16") == "FAIL" and
           st.get("t_ops") == "PASS" and st.get("m_ops") == "PASS" and st.get("r_recipe") == "PASS" and
           st.get("p_plan") == "PASS" and st.get("p_variants_small_p16_local") == "PASS" and
           st.get("v_timm_load") == "PASS" and st.get("tt_torch") == "PASS" and "tt_vitrain" not in st,
           f"the steps' statuses: {st}")
    tta = {f["name"]: f for f in res["figures"] if f["kind"] == "tta"}
    expect(tta.get("vitrain", {}).get("step") == "r_recipe" and
           tta["vitrain"].get("ratio_to", {}).get("torch-loop") and
           tta.get("torch-loop", {}).get("epochs") == 6, f"time to accuracy on verify's run: {tta}")
    expect(len([f for f in res["figures"] if f["kind"] == "export"]) == 2 and
           [c["pass"] for c in res["checks"] if c["name"].startswith("ViT-S/16 token export")] ==
           [True, True, True], "the export check's figures and checks")
    expect(os.path.exists(os.path.join(ROOT, "scripts", "gpu_check_nccl.sh")) or
           st.get("n_two_ranks") == "SKIP", "the NCCL step without its script")
    names = {(f["model"], f["name"]) for f in res["figures"] if f["kind"] == "bench"}
    for m in ("vit_small_patch16_224", "vit_base_patch16_224", "vit_tiny_patch4_32"):
        expect({(m, "vitrain"), (m, "timm-eager"), (m, "timm-compile-default")} <= names,
               f"{m}'s figures: {sorted(names)}")
    expect(("vit_small_patch16_224", "vitrain-local") in names, "the locality FFN's figure")
    variants = {(f["model"], f["name"], f["kernels"]) for f in res["figures"] if f["kind"] == "variant"}
    expect(("vit_small_patch16_224", "tuned", "autotune=on") in variants and
           ("vit_small_patch16_224", "dwone", "dwconv_forward=1") in variants,
           f"the presets' variants: {sorted(variants)}")
    expect(res["plan"] and res["device"]["name"] == "NVIDIA Dry-Run GPU", "the plan and device")
    train = [f for f in res["figures"] if f["kind"] == "train"]
    expect(len(train) == 1 and train[0]["model"] == "vit_fmnist_hybrid" and train[0]["top1_final"] == 88.1,
           f"the recipe's train figure: {train}")
    with tempfile.TemporaryDirectory() as dest:
        # 44 s less the 15 s reserve leaves at most 29 s when the op tests come up, whatever the
        # machine's speed: their ~30 s never fit (45 left exactly 30 on a quick machine).
        rc, out, res = dry_run(dest, GPU_CHECK_BUDGET_S="44")
    st = {s["id"]: (s["status"], s["note"]) for s in res["steps"]}
    expect(rc == 0 and res["verdict"] == "INCOMPLETE", f"a short budget: rc {rc}, {res['verdict']}")
    expect(st.get("a_info", ("",))[0] == "PASS" and st.get("s_vitrain_small_p16", ("",))[0] == "PASS",
           f"the steps that fit 30 s ran: {st}")
    expect(st.get("t_ops", ("", ""))[0] == "SKIP" and "needs ~30s" in st["t_ops"][1] and
           st.get("s_timm_small_p16", ("",))[0] == "SKIP", f"the steps that did not fit: {st}")
    with tempfile.TemporaryDirectory() as dest:  # the tta phase alone: its own vitrain run
        rc, out, res = dry_run(dest, "tta")
    st = {s["id"]: s["status"] for s in res["steps"]}
    tta = {f["name"]: f for f in res["figures"] if f["kind"] == "tta"}
    expect(rc == 0 and st == {"a_info": "PASS", "tt_vitrain": "PASS", "tt_torch": "PASS"} and
           tta.get("vitrain", {}).get("step") == "tt_vitrain" and "torch-loop" in tta,
           f"gpu_check.sh tta alone: rc {rc}, {st}, {tta}\n{out[-1500:]}")


def main():
    misses = []

    def expect(ok, what):
        if not ok:
            misses.append(what)

    if "--dry" in sys.argv:
        dry_checks(expect)
    else:
        report_checks(expect)
        verdict_checks(expect)
    for m in misses:
        print("gpu_check_report_test: MISS:", m)
    print(f"gpu_check_report_test: {len(misses)} misses")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
