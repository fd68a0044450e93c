#!/usr/bin/env python3
"""gpu_check.sh's report: reads a run's work dir (steps.tsv, metrics/, logs/) and writes, in
WORK/pack/, results.json, summary.md, log_tails.txt, kernels.json and console.txt (the summary
with the failures' log tails first, cut to fit the device tool's 12,000-character output tail).

Usage: gpu_check_report.py WORK PHASES START_S BUDGET_S FINAL(0|1) DRY(0|1)
(tests/gpu_check_report_test.py runs it on a made-up work dir and on a dry run.)

results.json: schema "vitrain-results/1" (scripts/results_tables.py reads it as it is) plus the
device check's own keys. Keys:
  schema, what, command, commit, local_changes (files the bundle's build had changed
  against the commit, from its MANIFEST.txt), date, device {kind, name, driver, cuda, memory, cc},
  versions {nvcc, cublaslt, torch, timm, cpu}, source, log_tail ("log_tails.txt"),
  dry (true: stub commands, made-up figures: never commit one), verdict (PASS | FAIL |
  INCOMPLETE: all that ran passed, some steps were SKIP), final (false: cut off or running),
  phases, budget_s, elapsed_s, counts {PASS, FAIL, TIMEOUT, SKIP},
  steps [{id, phase, title, status, rc, seconds, timeout_s, note, log, metrics {}}],
  figures, one record a figure:
    {kind: "bench", name, impl, model, batch, img_per_s, mfu, ratio_to {figure name: x},
     device, status ("ok" or why there is no img_per_s: "not compiled within 150 s", ...),
     timed_s, samples, kernels (the --kernels options), step}
       names: vitrain (its plan, autotune on), vitrain-local (--ffn local), timm-eager,
       timm-compile-<mode>; vitrain's ratio_to holds each timm figure's name and
       timm-compile-best (the fastest mode that compiled), vitrain-local's "vitrain"
    {kind: "variant", name, model, batch, ffn, kernels, img_per_s, mfu, ratio_to {first: x},
     rounds [img/s], status, step}  (bench --variant over scripts/gpu_presets.tsv)
    {kind: "train", run, model, recipe, device, epochs, top1_final, top1_best, wall_s,
     img_per_s, file}  (the default recipe)
    {kind: "tta", name (vitrain | torch-loop), step, model, recipe, device, epochs, top1_final,
     top1_best, curve [[s since the first update, top-1]], loop_s, process_s (the step's),
     target_top1 (the lower final top-1 of the two), time_to_target_s, ratio_to {torch-loop:
     its time to the target / vitrain's}, file | setup_s, impl_detail}  (time to accuracy)
    {kind: "export", name (the loader), model, classifier, precision (vitrain eval's), pass,
     rel_l2, max_abs_frac, top1_agree, tolerance, step}  (bench/timm_load_check.py)
  checks [{name, value, target, op (">=" | "<="), pass (true | false | null: not measured)}]:
    issues 46/48's acceptance points, figures timed over < 3 s, the recipe's top-1 vs
    GPU_CHECK_REF_TOP1, timm's load of the ViT-S/16 export and its logits,
  plan [{op, shape, variant, why}]: the device's kernels.json (p_plan's, else the recipe's),
  bench_plans {model: [{op, shape, variant, why}]}: the plan of each model's vitrain figure,
  nccl: scripts/gpu_check_nccl.sh's own results.json, where it wrote one."""
import csv, json, os, statistics, sys, time

work, phases, start, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
final, dry = sys.argv[5] == "1", len(sys.argv) > 6 and sys.argv[6] == "1"
logs, met, pack = (os.path.join(work, d) for d in ("logs", "metrics", "pack"))
os.makedirs(pack, exist_ok=True)
NUMERIC = {"top1", "local_changes", "passed", "failed", "skipped", "sanitizer_errors", "steps"}


def read_kv(path):
    out = {}
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            try:
                out[k] = (float(v) if "." in v else int(v)) if k in NUMERIC else v
            except ValueError:
                out[k] = v
    return out


def read_jsonl(path):
    rows = []
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


steps = []
for line in open(os.path.join(work, "steps.tsv"), errors="replace"):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 8:
        steps.append({"id": f[0], "phase": f[1], "title": f[2], "status": f[3],
                      "rc": None if f[4] == "-" else int(f[4]), "seconds": float(f[5]),
                      "timeout_s": int(f[6]), "note": f[7], "log": f"logs/{f[0]}.log",
                      "metrics": read_kv(os.path.join(met, f[0] + ".kv"))})
info = next((s["metrics"] for s in steps if s["id"] == "a_info"), {})


def kernels_of(r):
    """The --kernels options a bench line ran with: the plan's "kernels" field, or the old
    lines' env / kernel_calls (which the plan replaces)."""
    k = r.get("kernels")
    if isinstance(k, dict):  # the canonical k=v,... string: the keys not at their defaults
        return ",".join(o for o in str(k.get("options", "")).split(",")
                        if o and not o.endswith("=auto") and o not in ("gelu=erf", "autotune=off"))
    if r.get("env"):
        return ",".join(f"{a}={b}" for a, b in r["env"].items())
    return ", ".join(f"{a} {n}" for a, n in (r.get("kernel_calls") or {}).items() if n)


figures, samples, bench_plans = [], {}, {}
OWN_LINES = {"tt_torch", "v_timm_load"}  # steps whose JSON lines are not bench figures
for s in steps:
    for r in read_jsonl(os.path.join(met, s["id"] + ".jsonl")) if s["id"] not in OWN_LINES else []:
        base = {"model": r.get("model"), "batch": r.get("batch"), "step": s["id"],
                "kernels": kernels_of(r), "mfu": r.get("mfu")}
        if "variant" in r:
            figures.append(dict(base, kind="variant", name=r["variant"], ffn=r.get("ffn", ""),
                                img_per_s=r.get("median_img_per_s"),
                                rounds=r.get("img_per_s_rounds", []),
                                status=("error: " + str(r["error"])) if r.get("error") else "ok",
                                ratio_to={}, first_ratio=r.get("ratio_to_first")))
            continue
        name = s["metrics"].get("figure") or r.get("name") or "timm-" + str(r.get("mode"))
        if name == "vitrain" and isinstance(r.get("kernels"), dict):
            bench_plans.setdefault(r.get("model"), r["kernels"].get("plan", []))
        rate = r.get("median_img_per_s") or r.get("img_per_s")
        timed = r.get("timed_s")
        if timed is None and r.get("ms_per_step") and s["metrics"].get("steps"):
            timed = round(r["ms_per_step"] * s["metrics"]["steps"] / 1e3, 2)
        key = (name, r.get("model"), r.get("batch"))
        if key in samples and rate:  # a second sample of the same figure: the median of them
            fig = samples[key]
            fig["all"].append(rate)
            fig["img_per_s"], fig["samples"] = round(statistics.median(fig["all"]), 2), len(fig["all"])
            if r.get("mfu") is not None and fig["mfus"]:
                fig["mfus"].append(r["mfu"])
                fig["mfu"] = round(statistics.median(fig["mfus"]), 4)
            continue
        status = r.get("status") or ("error: " + str(r["error"]) if r.get("error") else "ok")
        fig = dict(base, kind="bench", name=name, impl=name, status=status,
                   device=os.environ.get("DEVICE", "cuda"),
                   img_per_s=rate, timed_s=timed, samples=1 if rate else 0, ratio_to={},
                   all=[rate] if rate else [], mfus=[r["mfu"]] if r.get("mfu") is not None else [])
        samples[key] = fig
        figures.append(fig)
for f in figures:
    f.pop("all", None), f.pop("mfus", None)
    if f["kind"] == "variant":  # each over the first variant of its step (bench's ratio)
        first = next(g for g in figures if g["kind"] == "variant" and g["step"] == f["step"])
        r = f.pop("first_ratio")
        if r is not None and f["img_per_s"]:
            f["ratio_to"] = {first["name"]: round(r, 4)}
by_model = {}
for f in figures:
    if f["kind"] == "bench" and f["img_per_s"]:
        by_model.setdefault((f["model"], f["batch"]), {})[f["name"]] = f["img_per_s"]
for f in figures:
    rates = by_model.get((f["model"], f["batch"]), {})
    if f["kind"] != "bench" or not f["img_per_s"]:
        continue
    if f["name"] == "vitrain":
        f["ratio_to"] = {n: round(f["img_per_s"] / v, 4) for n, v in rates.items()
                         if not n.startswith("vitrain")}
        comp = [v for n, v in rates.items() if n.startswith("timm-compile-")]
        if comp:
            f["ratio_to"]["timm-compile-best"] = round(f["img_per_s"] / max(comp), 4)
    elif f["name"] == "vitrain-local" and rates.get("vitrain"):
        f["ratio_to"] = {"vitrain": round(f["img_per_s"] / rates["vitrain"], 4)}


def fig(name, model, kind="bench"):
    return next((f for f in figures if f["kind"] == kind and f["name"] == name and
                 f["model"] == model), None)


checks = []


def check(name, value, target, op=">="):
    checks.append({"name": name, "value": value, "target": target, "op": op,
                   "pass": None if value is None else
                   value >= target if op == ">=" else value <= target})


for model, mfu, ratio in (("vit_small_patch16_224", 0.40, 1.5), ("vit_base_patch16_224", 0.45, 1.3),
                          ("vit_tiny_patch4_32", None, 2.0)):
    v = fig("vitrain", model)
    check(f"{model}: vitrain / fastest compiled timm mode", v and v["ratio_to"].get("timm-compile-best"),
          ratio)
    if mfu:
        check(f"{model}: vitrain MFU of 989 TFLOP/s", v and v["mfu"], mfu)
loc = fig("vitrain-local", "vit_small_patch16_224")
check("vit_small_patch16_224: locality FFN / plain MLP", loc and loc["ratio_to"].get("vitrain"), 0.9)
for f in figures:
    if f["kind"] == "variant" and f["name"] == "tuned":
        check(f"{f['model']}: autotune on / off (bench --variant)", f["ratio_to"].get("default"), 1.0)
timed = [f for f in figures if f["kind"] == "bench" and f.get("timed_s") is not None]
if timed:  # issue 48: each figure over >= 3 s of steps
    short = min(timed, key=lambda f: f["timed_s"])
    check(f"seconds of timed steps, the shortest figure ({short['model']} {short['name']})",
          short["timed_s"], 3.0)
recipe = next((s for s in steps if s["id"] == "r_recipe"), None)
top1 = recipe and recipe["metrics"].get("top1")
if os.environ.get("GPU_CHECK_REF_TOP1") and recipe:
    ref = float(os.environ["GPU_CHECK_REF_TOP1"])
    check(f"default recipe: top-1 - (reference {ref} - 0.3 points)", None if top1 is None else
          round(top1 - ref + 0.3, 2), 0.0)
summ = os.path.join(logs, "r_recipe", "summary.csv")
if top1 is not None and os.path.exists(summ):
    rows = list(csv.DictReader(open(summ)))
    evals = [float(r["eval_top1"]) for r in rows if r.get("eval_top1")]
    last = rows[-1] if rows else {}
    args = os.path.join(logs, "r_recipe", "args.yaml")
    model = next((l.split(":", 1)[1].strip().strip('"') for l in (open(args) if os.path.exists(args) else [])
                  if l.startswith("model:")), "")
    figures.append({"kind": "train", "run": "r_recipe", "model": model,
                    "recipe": "recipes/fmnist.yaml", "device": os.environ.get("DEVICE", "cuda"), "epochs": len(rows),
                    "top1_final": top1, "top1_best": max(evals + [top1]),
                    "wall_s": float(last.get("seconds") or 0),
                    "img_per_s": float(last.get("img_per_s") or 0), "file": "r_recipe/summary.csv"})

# Time to accuracy (issue 48): vitrain's recipe run (tt_vitrain, else verify's r_recipe where it
# passed) and the PyTorch loop's (tt_torch), each a curve of (seconds since the first update,
# evaluations included; test top-1) per epoch; the target is the lower of the two final top-1s.
step_of = {s["id"]: s for s in steps}
tta = []
vsid = next((i for i in ("tt_vitrain", "r_recipe") if step_of.get(i, {}).get("status") == "PASS" and
             os.path.exists(os.path.join(logs, i, "summary.csv"))), None)
if vsid:
    rows = [r for r in csv.DictReader(open(os.path.join(logs, vsid, "summary.csv"))) if r.get("eval_top1")]
    if rows:
        tta.append({"name": "vitrain", "step": vsid, "file": f"{vsid}/summary.csv",
                    "curve": [[float(r["seconds"]), float(r["eval_top1"])] for r in rows]})
trows = read_jsonl(os.path.join(met, "tt_torch.jsonl"))
tcurve = [[r["elapsed_s"], r["top1"]] for r in trows if "epoch" in r and "top1" in r]
if tcurve:
    final_row = next((r for r in trows if r.get("final")), {})
    tta.append({"name": "torch-loop", "step": "tt_torch", "setup_s": final_row.get("setup_s"),
                "impl_detail": {k: final_row.get(k) for k in ("attention", "optimizer", "precision",
                                                               "compile", "torch") if k in final_row},
                "curve": tcurve})
target = min(f["curve"][-1][1] for f in tta) if len(tta) == 2 else None
for f in tta:
    c = f["curve"]
    reach = next((t for t, acc in c if target is not None and acc >= target), None)
    f.update(kind="tta", model="vit_fmnist_hybrid", recipe="recipes/fmnist.yaml",
             device=os.environ.get("DEVICE", "cuda"), epochs=len(c), top1_final=c[-1][1],
             top1_best=max(acc for _, acc in c), loop_s=c[-1][0], target_top1=target,
             time_to_target_s=reach, process_s=step_of.get(f["step"], {}).get("seconds"), ratio_to={})
    figures.append(f)
if len(tta) == 2 and all(f["time_to_target_s"] for f in tta):  # > 1: vitrain reaches it first
    tta[0]["ratio_to"] = {"torch-loop": round(tta[1]["time_to_target_s"] / tta[0]["time_to_target_s"], 4)}
# The export check (issue 48): timm's vit_small_patch16_224 (class token) loads vitrain's export
# and its logits match vitrain eval's, per precision (bench/timm_load_check.py).
tl = next((r for r in read_jsonl(os.path.join(met, "v_timm_load.jsonl")) if r.get("check")), None)
if tl is not None:
    for x in tl.get("results", []):
        figures.append({"kind": "export", "name": x.get("loader"), "model": tl.get("model"),
                        "classifier": tl.get("classifier"), "step": "v_timm_load",
                        **{k: x.get(k) for k in ("precision", "pass", "rel_l2", "max_abs_frac",
                                                 "top1_agree", "tolerance")}})
    primary = "timm vit_small_patch16_224"
    check("ViT-S/16 token export: timm vit_small_patch16_224 loads it (strict)",
          int(primary in tl.get("loaders", [])), 1)
    for prec, tol in (("fp32", 1e-4), ("bf16", 3e-2)):
        x = next((x for x in tl.get("results", []) if x.get("loader") == primary and
                  x.get("precision") == prec), None)
        # pass: the relative L2, the max abs difference and the top-1 agreement within tolerance
        check(f"ViT-S/16 token export: timm vs vitrain eval {prec}, logits rel L2", x and x.get("rel_l2"),
              ((x or {}).get("tolerance") or {}).get("rel_l2", tol), "<=")
        if x:
            checks[-1]["pass"] = bool(x.get("pass"))

plan_src = next((p for p in (os.path.join(logs, d, "kernels.json") for d in ("p_plan", "r_recipe"))
                 if os.path.exists(p)), None)
plan = []
if plan_src:
    try:
        k = json.load(open(plan_src))
        plan = k.get("plan", k) if isinstance(k, dict) else k
        json.dump(k, open(os.path.join(pack, "kernels.json"), "w"), indent=1)
    except ValueError:
        pass
nccl = next((json.load(open(p)) for p in (os.path.join(met, s["id"] + ".nccl.json") for s in steps)
             if os.path.exists(p)), None)
counts = {k: sum(1 for s in steps if s["status"] == k) for k in ("PASS", "FAIL", "TIMEOUT", "SKIP")}
verdict = ("FAIL" if counts["FAIL"] + counts["TIMEOUT"] or not steps else
           "INCOMPLETE" if counts["SKIP"] or not final else "PASS")
started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
res = {"schema": "vitrain-results/1",
       "what": f"scripts/gpu_check.sh {phases}" + (" (DRY RUN: stub commands, made-up figures)" if dry else ""),
       "command": f"bash scripts/gpu_check.sh {phases}", "commit": info.get("commit") or None,
       "local_changes": info.get("local_changes"),
       "date": started, "device": {"kind": "cuda", "name": info.get("gpu"), "driver": info.get("driver"),
                                   "cuda": info.get("cuda_driver"), "memory": info.get("gpu_memory"),
                                   "cc": info.get("cc")},
       "versions": {k: info[k] for k in ("nvcc", "cublaslt", "torch", "timm", "cpu") if info.get(k)},
       "source": "scripts/gpu_check_report.py", "log_tail": "log_tails.txt", "dry": dry,
       "verdict": verdict, "final": final, "phases": phases, "budget_s": budget,
       "elapsed_s": round(time.time() - start, 1), "counts": counts, "steps": steps,
       "figures": figures, "checks": checks, "plan": plan, "bench_plans": bench_plans, "nccl": nccl}
with open(os.path.join(pack, "results.json"), "w") as f:
    json.dump(res, f, indent=1)
    f.write("\n")


def pct(x):
    return "" if x is None else f"{100 * x:.1f}%"


def g(k):
    return str(info.get(k) or "?")


L = [f"# gpu_check {phases}: {verdict}" + (" (DRY RUN: made-up figures)" if dry else "") +
     ("" if final else " (still running or cut off)"), "",
     f"{started}, {res['elapsed_s']} s of a {budget} s budget. GPU {g('gpu')} ({g('gpu_memory')}, "
     f"cc {g('cc')}), driver {g('driver')}, CUDA {g('cuda_driver')}, nvcc {g('nvcc')}, cuBLASLt "
     f"{g('cublaslt')}, torch {g('torch')}, timm {g('timm')}; commit {g('commit')[:12]}.", "",
     " | ".join(f"{k} {v}" for k, v in counts.items()), "",
     "| step | status | s | note |", "|---|---|---:|---|"]
L += [f"| {s['id']} {s['title']} | {s['status']} | {s['seconds']:.1f} | {s['note']} |" for s in steps]
bench = [f for f in figures if f["kind"] == "bench"]
if bench:
    L += ["", "Training-step throughput (synthetic batch on the device; img/s the median of chunks; "
          "MFU = 3 x analytic forward FLOPs / 989 TFLOP/s):", "",
          "| model | batch | figure | img/s | MFU | vs | timed s | samples | kernels | status |",
          "|---|---:|---|---:|---:|---|---:|---:|---|---|"]
    for f in sorted(bench, key=lambda f: (str(f["model"]), f["name"])):
        vs = ", ".join(f"{x:.2f}x {n}" for n, x in f["ratio_to"].items())
        L.append(f"| {f['model']} | {f['batch']} | {f['name']} | {f['img_per_s'] or ''} | {pct(f['mfu'])} "
                 f"| {vs} | {f['timed_s'] or ''} | {f['samples']} | {f['kernels']} | {f['status']} |")
var = [f for f in figures if f["kind"] == "variant"]
if var:
    L += ["", "Kernel-plan variants (scripts/gpu_presets.tsv; bench --variant, interleaved rounds):", "",
          "| model | batch | variant | --kernels | img/s by round | median | vs first | MFU | step |",
          "|---|---:|---|---|---|---:|---:|---:|---|"]
    for f in var:
        rounds = ", ".join(str(x) for x in f["rounds"])
        if f["status"] != "ok":
            rounds += ("; " if rounds else "") + "FAILED: " + f["status"][7:127].replace("|", "/")
        vs = ", ".join(f"{x:.3f}x" for x in f["ratio_to"].values())
        L.append(f"| {f['model']} | {f['batch']} | {f['name']} | {f['kernels']} | {rounds} | "
                 f"{f['img_per_s'] or ''} | {vs} | {pct(f['mfu'])} | {f['step']} |")
tt = [f for f in figures if f["kind"] == "tta"]
if tt:
    L += ["", "Time to accuracy, the default recipe (top-1 after each epoch at s since the first "
          "update; target: the lower final top-1):", "",
          "| impl | epochs | final top-1 | best | target | s to target | vs | loop s | step s | curve |",
          "|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for f in tt:
        vs = ", ".join(f"{x:.2f}x {n}" for n, x in f["ratio_to"].items())
        curve = ", ".join(f"{acc:g}@{t:.0f}s" for t, acc in f["curve"])
        L.append(f"| {f['name']} | {f['epochs']} | {f['top1_final']} | {f['top1_best']} | "
                 f"{f['target_top1'] or ''} | {f['time_to_target_s'] or ''} | {vs} | {f['loop_s']} | "
                 f"{'' if f['process_s'] is None else f['process_s']} | {curve} |")
ex = [f for f in figures if f["kind"] == "export"]
if ex:
    L += ["", "timm loads vitrain's ViT-S/16 token export; logits vs vitrain eval:", "",
          "| loader | vitrain eval | rel L2 | max abs / max logit | top-1 agree | pass |",
          "|---|---|---:|---:|---:|---|"]
    L += [f"| {f['name']} | {f['precision']} | {f['rel_l2']:.3g} | {f['max_abs_frac']:.3g} | "
          f"{f['top1_agree']} | {'yes' if f['pass'] else 'NO'} |" for f in ex]
if checks:
    L += ["", "Acceptance points (value >= target, or <= where the target says):", "",
          "| check | value | target | pass |", "|---|---:|---:|---|"]
    L += [f"| {c['name']} | {'' if c['value'] is None else c['value']} | "
          f"{'<= ' if c['op'] == '<=' else ''}{c['target']} | "
          f"{'not measured' if c['pass'] is None else 'yes' if c['pass'] else 'NO'} |" for c in checks]
if plan:
    L += ["", f"The device's kernel plan ({len(plan)} ops, kernels.json): " +
          "; ".join(f"{p.get('op')} {p.get('variant')} ({p.get('why')})" for p in plan[:12])]


def tail(sid, n):
    p = os.path.join(logs, sid + ".log")
    if not os.path.exists(p):
        return []
    return [t.rstrip()[:300] for t in open(p, errors="replace").read().splitlines() if t.strip()][-n:]


fails = [s for s in steps if s["status"] in ("FAIL", "TIMEOUT")]
F = []
for s in fails:
    F += ["", f"### {s['id']} ({s['status']}, rc {s['rc']}): last lines of {s['log']}", "", "```"]
    F += tail(s["id"], 25) + ["```"]
with open(os.path.join(pack, "summary.md"), "w") as f:
    f.write("\n".join(L + F) + "\n")
with open(os.path.join(pack, "log_tails.txt"), "w") as f:
    for s in steps:
        if s["status"] != "SKIP" or s["rc"] is not None:
            f.write(f"===== {s['id']} {s['status']}: {s['title']}\n" + "\n".join(tail(s["id"], 40)) + "\n")
# The console copy: failures' tails first, shortened to fit, then the tables, so the device
# tool's 12,000-character output tail always holds the whole table.
table = "\n".join(L) + "\n"
per = max(0, 11000 - len(table)) // max(1, len(fails))
C = []
for s in fails:
    lines = [t[:200] + "\n" for t in tail(s["id"], 10)]
    while lines and sum(map(len, lines)) > per - 80:
        lines.pop(0)
    if lines:
        C.append(f"--- {s['id']}: last lines of logs/{s['id']}.log\n" + "".join(lines))
with open(os.path.join(pack, "console.txt"), "w") as f:
    f.write("".join(C) + ("\n" if C else "") + table)
