#!/usr/bin/env python3
"""The README's results table and docs/benchmarks.md's tables, generated from run artefacts.

Every figure the docs show comes from a committed docs/runs/<name>/results.json (schema below and
in docs/benchmarks.md, "Run artefacts"); a headline row whose artefact does not exist says "not yet
measured at this commit" instead of carrying a number over from prose.

  results_tables.py --check [--root DIR]   exit 1 with a one-line summary when a generated block
                                           in README.md or docs/benchmarks.md differs from the text
  results_tables.py --write [--root DIR]   rewrite those blocks in place
  results_tables.py wrap RUN_DIR --what TEXT --device KIND [--device-name NAME] [--commit C]
                    [--source TEXT] [--log-tail FILE]
                                           write RUN_DIR/results.json from the summary.csv and
                                           args.yaml of RUN_DIR itself or of its sub-folders

Generated blocks sit between `<!-- results:NAME begin -->` and `<!-- results:NAME end -->`.
results.json (schema "vitrain-results/1"):
  what, command (or null), commit (or null: unknown), date, device {kind, name, driver, cuda},
  versions {name: version}, source (how the file was made), log_tail (a file beside it, or null),
  figures: [{kind: "train", run, model, recipe, device, epochs, top1_final, top1_best, wall_s,
             img_per_s, file} | {kind: "bench", model, batch, impl, img_per_s, device}]
scripts/gpu_check.sh writes this schema with keys of its own (bench figures named "vitrain",
"timm-eager", "timm-compile-<mode>", with ratio_to; variant figures); a "dry": true file (made-up
figures) is refused. An older gpu_check results.json (keys "bench" and "system") is read too.
Python 3 standard library only.
"""
import argparse
import csv
import json
import os
import statistics
import sys

SCHEMA = "vitrain-results/1"
NOT_MEASURED = "not yet measured at this commit"

# The README's headline rows: (label, run folder under docs/runs, which figures); a folder
# `<date>-gpu-check` (a committed gpu_check.sh results.json) matches "gpu-check", the newest wins.
# A train row shows the spread over the run folder's train figures for that model; a bench row
# shows vitrain's img/s and its ratio to timm eager and torch.compile from the same results.json.
HEADLINES = [
    ("Default recipe (6 epochs)", "fmnist_default", {"kind": "train", "model": "vit_fmnist_hybrid"}),
    ("30-minute recipe", "fmnist_30m", {"kind": "train", "model": "vit_fmnist_local"}),
    ("Long recipe, mixup/cutmix (100 epochs)", "fmnist_long_gpu",
     {"kind": "train", "model": "vit_tiny_patch4_28", "run": "mixup_cutmix"}),
    ("Default recipe on the GPU", "gpu-check", {"kind": "train", "model": "vit_fmnist_hybrid"}),
    ("Training step, synthetic batch", "gpu-check", {"kind": "bench", "model": "vit_small_patch16_224"}),
    ("Training step, synthetic batch", "gpu-check", {"kind": "bench", "model": "vit_base_patch16_224"}),
    ("Training step, synthetic batch", "gpu-check", {"kind": "bench", "model": "vit_tiny_patch4_32"}),
]


def pick_run(runs, spec):
    """The run folder named spec, else the newest (last in name order) named <date>-spec."""
    if spec in runs:
        return spec
    hits = sorted(n for n in runs if n.endswith("-" + spec))
    return hits[-1] if hits else None


def fail(msg):
    print(f"results_tables: {msg}", file=sys.stderr)
    sys.exit(2)


# ---- reading artefacts -------------------------------------------------------------------------

def read_args_yaml(path):
    """vitrain's args.yaml is flat `key: value`; strings are JSON-quoted."""
    out = {}
    for line in open(path, encoding="utf-8"):
        if ":" not in line or line.startswith("#"):
            continue
        k, v = line.split(":", 1)
        v = v.strip()
        try:
            out[k.strip()] = json.loads(v)
        except ValueError:
            out[k.strip()] = v
    return out


def train_figure(run_dir, name, device):
    """One train figure from a vitrain run folder's summary.csv + args.yaml."""
    rows = list(csv.DictReader(open(os.path.join(run_dir, "summary.csv"), encoding="utf-8")))
    if not rows:
        fail(f"{run_dir}/summary.csv has no epochs")
    args = read_args_yaml(os.path.join(run_dir, "args.yaml"))
    top1 = [float(r["eval_top1"]) for r in rows]
    rates = [float(r["img_per_s"]) for r in rows if r.get("img_per_s")]
    return {"kind": "train", "run": name, "model": args.get("model", "?"),
            "recipe": args.get("experiment", ""), "device": device, "epochs": len(rows),
            "top1_final": top1[-1], "top1_best": max(top1),
            "wall_s": float(rows[-1]["seconds"]),
            "img_per_s": round(statistics.median(rates), 1) if rates else None,
            "file": os.path.join(name, "summary.csv") if name else "summary.csv"}


def wrap(a):
    """results.json for a folder of vitrain run folders (or one run folder)."""
    subs = sorted(d for d in os.listdir(a.run_dir)
                  if os.path.isfile(os.path.join(a.run_dir, d, "summary.csv")))
    names = [""] if os.path.isfile(os.path.join(a.run_dir, "summary.csv")) else subs
    if not names:
        fail(f"{a.run_dir}: no summary.csv in it or its sub-folders")
    figs = [train_figure(os.path.join(a.run_dir, n), n, a.device) for n in names]
    res = {"schema": SCHEMA, "what": a.what, "command": a.command, "commit": a.commit,
           "date": a.date, "device": {"kind": a.device, "name": a.device_name,
                                      "driver": None, "cuda": None},
           "versions": {}, "source": a.source, "log_tail": a.log_tail, "figures": figs}
    with open(os.path.join(a.run_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


def from_gpu_check(d):
    """A gpu_check.sh results.json as this schema: its bench rows become bench figures."""
    sysinfo = d.get("system", {})
    rates = {}  # (model, batch, impl) -> img/s of each round
    for b in d.get("bench", []):
        impl = b.get("impl", "")
        if impl.startswith("vitrain-") and impl.count("-") == 1:
            impl = "vitrain"  # the build as it is ("vitrain-cuda"); variants keep their suffix
        if b.get("img_per_s"):
            rates.setdefault((b.get("model"), b.get("batch"), impl), []).append(b["img_per_s"])
    figs = [{"kind": "bench", "model": m, "batch": bt, "impl": i, "device": "cuda",
             "img_per_s": round(statistics.median(r), 1), "rounds": len(r)}
            for (m, bt, i), r in sorted(rates.items(), key=lambda kv: tuple(map(str, kv[0])))]
    return {"schema": SCHEMA, "what": f"gpu_check.sh {d.get('phase', '')}: {d.get('overall', '')}",
            "command": "scripts/gpu_check.sh", "commit": sysinfo.get("bundle_commit"),
            "date": d.get("started"),
            "device": {"kind": "cuda", "name": sysinfo.get("gpu"), "driver": sysinfo.get("driver"),
                       "cuda": sysinfo.get("cuda_driver_api")},
            "versions": {k: sysinfo[k] for k in ("nvcc", "torch", "timm") if k in sysinfo},
            "source": "scripts/gpu_check_report.py", "log_tail": "console.txt", "figures": figs}


def load_runs(root):
    runs = {}
    base = os.path.join(root, "docs", "runs")
    if not os.path.isdir(base):
        return runs
    for name in sorted(os.listdir(base)):
        p = os.path.join(base, name, "results.json")
        if not os.path.isfile(p):
            continue
        try:
            d = json.load(open(p, encoding="utf-8"))
        except ValueError as e:
            fail(f"{p}: not JSON ({e})")
        if d.get("dry"):
            fail(f"{p}: a dry run's made-up figures (\"dry\": true) must not be committed")
        if d.get("schema") != SCHEMA:
            if "bench" in d and "system" in d:
                d = from_gpu_check(d)
            else:
                fail(f"{p}: schema is {d.get('schema')!r}, expected {SCHEMA!r}")
        runs[name] = d
    return runs


# ---- formatting ----------------------------------------------------------------------------------

def num(x, fmt="{:,.0f}"):
    return "" if x is None else fmt.format(x)


def spread(vals, fmt):
    vals = [v for v in vals if v is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def device_text(run):
    d = run.get("device", {})
    return d.get("name") or d.get("kind") or "?"


def matches(fig, sel):
    return all(fig.get(k) == v for k, v in sel.items())


def readme_table(runs):
    out = ["| what | model | device | img/s | × timm eager | × torch.compile | top-1 % | wall | artefact |",
           "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for label, name, sel in HEADLINES:
        name = pick_run(runs, name)
        run = runs.get(name)
        figs = [f for f in run["figures"] if matches(f, sel)] if run else []
        if sel["kind"] == "bench":
            figs = [f for f in figs if f.get("name", f.get("impl")) == "vitrain" and f.get("img_per_s")]
        model = sel["model"]
        if not figs:
            out.append(f"| {label} | `{model}` | | {NOT_MEASURED} | | | | | |")
            continue
        link = f"[{name}](docs/runs/{name}/results.json)"
        n = f" ({len(figs)} runs)" if len(figs) > 1 else ""
        if sel["kind"] == "train":
            out.append(f"| {label}{n} | `{model}` | {device_text(run)} | "
                       f"{spread([f['img_per_s'] for f in figs], '{:,.0f}')} | n/a | n/a | "
                       f"{spread([f['top1_final'] for f in figs], '{:.2f}')} | "
                       f"{spread([f['wall_s'] for f in figs], '{:,.0f}')} s | {link} |")
        else:
            f = figs[0]
            def ratio(impl):
                """vitrain over `impl` (the fastest figure named so), from the same artefact."""
                if impl in f.get("ratio_to", {}):  # the device check's own, same run
                    return f"{f['ratio_to'][impl]:.2f}"
                base = [g["img_per_s"] for g in run["figures"] if g.get("kind") == "bench" and
                        g.get("model") == model and g.get("batch") == f.get("batch") and
                        g.get("name", g.get("impl", "")).startswith(impl) and g.get("img_per_s")]
                return f"{f['img_per_s'] / max(base):.2f}" if base else NOT_MEASURED
            compiled = "timm-compile-best" if "timm-compile-best" in f.get("ratio_to", {}) \
                else "timm-compile"
            out.append(f"| {label} | `{model}` | {device_text(run)} | {num(f['img_per_s'])} | "
                       f"{ratio('timm-eager')} | {ratio(compiled)} | | | {link} |")
    return out


def bench_train_table(runs):
    out = ["| artefact | run | model | device | epochs | top-1 % last | top-1 % best | wall s | img/s (median) |",
           "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for name, run in runs.items():
        for f in run["figures"]:
            if f.get("kind") != "train":
                continue
            out.append(f"| [{name}](runs/{name}/results.json) | {f.get('run') or '-'} | "
                       f"`{f['model']}` | {device_text(run)} | {f['epochs']} | "
                       f"{f['top1_final']:.2f} | {f['top1_best']:.2f} | {f['wall_s']:,.0f} | "
                       f"{num(f.get('img_per_s'))} |")
    if len(out) == 2:
        out.append(f"| {NOT_MEASURED} | | | | | | | | |")
    return out


def bench_step_table(runs):
    out = ["| artefact | model | batch | what | device | img/s |", "|---|---|---:|---|---|---:|"]
    for name, run in runs.items():
        for f in run["figures"]:
            if f.get("kind") in ("bench", "variant"):
                what = f.get("name", f.get("impl", ""))
                what = f"variant {what}" if f["kind"] == "variant" else what
                rate = num(f.get("img_per_s")) if f.get("img_per_s") else f.get("status", "")
                out.append(f"| [{name}](runs/{name}/results.json) | `{f['model']}` | "
                           f"{f.get('batch', '')} | {what} | {device_text(run)} | {rate} |")
    if len(out) == 2:
        out.append(f"| {NOT_MEASURED} | | | | | |")
    return out


def provenance_table(runs):
    out = ["| artefact | what | build commit | device |", "|---|---|---|---|"]
    for name, run in runs.items():
        out.append(f"| [{name}](runs/{name}/results.json) | {run.get('what', '')} | "
                   f"{run.get('commit') or 'unknown'} | {device_text(run)} |")
    return out


BLOCKS = {  # file -> {block name -> generator}
    "README.md": {"readme": readme_table},
    os.path.join("docs", "benchmarks.md"): {"train": bench_train_table, "bench": bench_step_table,
                                            "provenance": provenance_table},
}


# ---- blocks --------------------------------------------------------------------------------------

def replace_block(text, name, lines, path):
    begin, end = f"<!-- results:{name} begin -->", f"<!-- results:{name} end -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        fail(f"{path}: no '{begin}' ... '{end}' block")
    head = text[:i + len(begin)]
    return head + "\n" + "\n".join(lines) + "\n" + text[j:]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "wrap":
        ap = argparse.ArgumentParser(prog="results_tables.py wrap")
        ap.add_argument("run_dir")
        ap.add_argument("--what", required=True)
        ap.add_argument("--device", required=True, choices=["cpu", "emu", "cuda"])
        ap.add_argument("--device-name")
        ap.add_argument("--commit")
        ap.add_argument("--date")
        ap.add_argument("--command")
        ap.add_argument("--source", default="results_tables.py wrap: summary.csv + args.yaml")
        ap.add_argument("--log-tail")
        wrap(ap.parse_args(sys.argv[2:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    a = ap.parse_args()
    runs = load_runs(a.root)
    stale = []
    for rel, blocks in BLOCKS.items():
        path = os.path.join(a.root, rel)
        if not os.path.isfile(path):
            fail(f"{path}: missing")
        old = open(path, encoding="utf-8").read()
        new = old
        for name, gen in blocks.items():
            new = replace_block(new, name, gen(runs), rel)
        if new != old:
            changed = [n for n, gen in blocks.items() if replace_block(old, n, gen(runs), rel) != old]
            stale.append(f"{rel} ({', '.join(changed)})")
            if a.write:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if stale and a.check:
        print(f"results_tables: stale generated tables in {'; '.join(stale)}: "
              f"run scripts/results_tables.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
