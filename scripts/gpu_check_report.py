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
  checks [{name, value, target, pass (true | false | null: not measured)}]: issues 46/48's
    acceptance points, figures timed over < 3 s, the recipe's top-1 vs GPU_CHECK_REF_TOP1,
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
for s in steps:
    for r in read_jsonl(os.path.join(met, s["id"] + ".jsonl")):
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


def check(name, value, target):
    checks.append({"name": name, "value": value, "target": target,
                   "pass": None if value is None else value >= target})


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
if checks:
    L += ["", "Acceptance points (value >= target):", "", "| check | value | target | pass |",
          "|---|---:|---:|---|"]
    L += [f"| {c['name']} | {'' if c['value'] is None else c['value']} | {c['target']} | "
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
