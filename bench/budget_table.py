#!/usr/bin/env python3
"""Budgeted runs of the default recipe under load: how much of each --budget a run uses.

For every cell of budgets x curricula x EMA (off/on) it runs
  vitrain train --budget B --curriculum C [--model-ema] [EXTRA...]
while --load busy loops (one process each, pure Python spinning) share the cores, and records
what the run says ("Budget: stopped after X s of Y s (Z% used), N updates"), the process's wall
time, the final top-1, the 1-minute load average before and after, and whether the run ended
inside its budget with at least 85% of it used. results.json (schema vitrain-results/1, figures
of kind "budget") and each run's log tail (logs/CELL.txt) go to OUT; results.json is rewritten
after every run, so a matrix cut short keeps what it measured.

  budget_table.py --table OUT   print OUT/results.json as the Markdown table of docs/budget.md
  budget_table.py OUT [--vitrain PATH] [--budgets 60s,90s,5m] [--curricula none,size,efficienttrain]
                  [--ema off,on] [--load 1] [--only CELL,...] [--commit C] [-- EXTRA vitrain flags]

Cells are named <budget>_<curriculum>_<ema|noema>; --only runs the named ones. Python 3 standard
library only.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SCHEMA = "vitrain-results/1"
STOP_RE = re.compile(r"Budget: stopped after ([0-9.]+)s of ([0-9.]+)s \(([0-9.]+)% used\), (\d+) updates")
TOP1_RE = re.compile(r"Final test top-1: ([0-9.]+)%")
FINAL_RE = re.compile(r"the final evaluation and checkpoint took ([0-9.]+)s \(([0-9.]+)s kept")


def spin():
    while True:
        pass


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cpu_name():
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def seconds(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([hms]?)", text)
    if not m:
        sys.exit(f"budget_table: bad budget '{text}' (use e.g. 60s, 90s, 5m)")
    return float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "": 1}[m.group(2)]


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_log_facts(path):
    """From a run's log.jsonl: the stop rule's probes (elapsed s, one evaluation's estimate s)
    and the schedules' progress in the last training record (every --log-interval updates)."""
    facts = {"probes": []}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("type") == "budget_probe":
            facts["probes"].append([round(j["elapsed_s"], 1), round(j["one_eval_s"], 2)])
        elif j.get("type") == "train" and "fraction" in j:
            facts["last_logged_progress"] = round(j["fraction"], 3)
    return facts


def run_cell(a, budget, curriculum, ema, runs_dir):
    name = f"{budget}_{curriculum}_{'ema' if ema else 'noema'}"
    cmd = [a.vitrain, "train", "--budget", budget, "--curriculum", curriculum,
           "--output", runs_dir, "--experiment", name] + (["--model-ema"] if ema else []) + a.extra
    load_before = os.getloadavg()[0]
    cpu0 = child_cpu_s()
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    cpu = child_cpu_s() - cpu0
    load_after = os.getloadavg()[0]
    out = p.stdout + p.stderr
    tail = "\n".join(out.splitlines()[-15:])
    with open(os.path.join(a.out, "logs", name + ".txt"), "w", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n" + tail + "\n")
    total = seconds(budget)
    fig = {"kind": "budget", "run": name, "model": "vit_fmnist_hybrid", "budget_s": total,
           "curriculum": curriculum, "model_ema": ema, "exit_code": p.returncode,
           "wall_s": round(wall, 2), "load1_before": round(load_before, 2),
           "load1_after": round(load_after, 2), "busy_loops": a.load,
           "cpu_s": round(cpu, 1), "cores_used": round(cpu / max(wall, 1e-9), 2),
           "log_tail": f"logs/{name}.txt"}
    fig.update(run_log_facts(os.path.join(runs_dir, name, "log.jsonl")))
    m = STOP_RE.search(out)
    if m:
        used = float(m.group(1))
        fig.update({"used_s": used, "used_frac": round(used / total, 4), "updates": int(m.group(4)),
                    "inside": used <= total, "used_85": used >= 0.85 * total,
                    "too_small": "is too small for this run" in out})
    fin = FINAL_RE.search(out)
    if fin:
        fig.update({"final_s": float(fin.group(1)), "final_kept_s": float(fin.group(2))})
    t = TOP1_RE.search(out)
    fig["top1_final"] = float(t.group(1)) if t else None
    return fig


def write(a, meta, figures):
    doc = dict(meta, figures=figures)
    tmp = os.path.join(a.out, "results.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(a.out, "results.json"))


def table(out):
    doc = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))
    print("| budget | curriculum | EMA | used s | used % | final eval s (kept) | process wall s "
          "| updates | top-1 % | load (1 min) before → after | vitrain's cores | inside, >= 85% |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
    order = {"none": 0, "size": 1, "efficienttrain": 2}
    figs = sorted(doc["figures"], key=lambda f: (f["budget_s"], order.get(f["curriculum"], 9),
                                                  f["model_ema"]))
    for f in figs:
        ok = "yes" if f.get("inside") and f.get("used_85") else "no"
        if f.get("too_small"):
            ok += " (too small)"
        if "final_s" not in f:  # older rows: from the log tail
            m = FINAL_RE.search(open(os.path.join(out, f["log_tail"]), encoding="utf-8").read())
            if m:
                f["final_s"], f["final_kept_s"] = float(m.group(1)), float(m.group(2))
        fin = f"{f['final_s']:.1f} ({f['final_kept_s']:.1f})" if "final_s" in f else "-"
        used = f.get("used_s")
        used_txt = f"{used:.1f} | {100 * f['used_frac']:.1f}" if used is not None else "- | -"
        print(f"| {f['budget_s']:.0f} s | {f['curriculum']} | {'on' if f['model_ema'] else 'off'} "
              f"| {used_txt} | {fin} | {f['wall_s']:.1f} | {f.get('updates', '-')} | "
              f"{f.get('top1_final') or '-'} | {f['load1_before']:.1f} → {f['load1_after']:.1f} "
              f"| {f.get('cores_used', '-')} | {ok} |")


def main():
    argv = sys.argv[1:]
    if len(argv) == 2 and argv[0] == "--table":
        table(argv[1])
        return 0
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--vitrain", default="build-budget/vitrain")
    ap.add_argument("--budgets", default="60s,90s,5m")
    ap.add_argument("--curricula", default="none,size,efficienttrain")
    ap.add_argument("--ema", default="off,on")
    ap.add_argument("--load", type=int, default=1, help="busy loops beside each run")
    ap.add_argument("--only", default="", help="comma-separated cell names")
    ap.add_argument("--commit", help="the commit vitrain was built from (default: git HEAD here)")
    a = ap.parse_args(argv)
    a.extra = extra
    if not os.access(a.vitrain, os.X_OK):
        sys.exit(f"budget_table: no vitrain at '{a.vitrain}'")
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    old = os.path.join(a.out, "results.json")
    figures = json.load(open(old, encoding="utf-8"))["figures"] if os.path.isfile(old) else []
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    meta = {"schema": SCHEMA,
            "what": "budgeted runs of the default recipe (vit_fmnist_hybrid, Fashion-MNIST) with "
                    f"{a.load} busy loop(s) on the cores: used fraction and end vs budget",
            "command": "bench/budget_table.py " + " ".join(sys.argv[1:]),
            "commit": a.commit or (git("rev-parse", "--short", "HEAD") or "?") + ("+dirty" if dirty else ""),
            "date": datetime.date.today().isoformat(),
            "device": {"kind": "cpu", "name": f"{os.cpu_count()}-core {cpu_name()}",
                       "driver": None, "cuda": None},
            "versions": {"python": platform.python_version(), "kernel": platform.release()},
            "source": "bench/budget_table.py: each run's 'Budget: stopped' line and final top-1",
            "log_tail": "logs/"}
    only = set(filter(None, a.only.split(",")))
    runs_dir = tempfile.mkdtemp(prefix="budget_table_")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the busy loops end with it
    loads = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.load)]
    for p in loads:
        p.start()
    try:
        for budget in a.budgets.split(","):
            for curriculum in a.curricula.split(","):
                for ema in [e == "on" for e in a.ema.split(",")]:
                    name = f"{budget}_{curriculum}_{'ema' if ema else 'noema'}"
                    if only and name not in only:
                        continue
                    fig = run_cell(a, budget, curriculum, ema, runs_dir)
                    figures = [f for f in figures if f.get("run") != name] + [fig]
                    write(a, meta, figures)
                    print(f"{name}: used {fig.get('used_s')} s of {fig['budget_s']:.0f} s "
                          f"({100 * fig.get('used_frac', 0):.1f}%), wall {fig['wall_s']} s, "
                          f"{fig.get('updates')} updates, top-1 {fig['top1_final']}, "
                          f"load {fig['load1_before']}->{fig['load1_after']}, "
                          f"{fig['cores_used']} cores, progress {fig.get('last_logged_progress')}",
                          flush=True)
    finally:
        for p in loads:
            p.terminate()
        shutil.rmtree(runs_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
