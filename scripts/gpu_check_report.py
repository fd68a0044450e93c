#!/usr/bin/env python3
"""gpu_check.sh's report: reads a run's work dir (steps.tsv, metrics/, logs/) and writes
pack/results.json, pack/summary.md and pack/console.txt (the summary with the failures' log
tails first, cut to fit the device tool's 12,000-character output tail).

Usage: gpu_check_report.py WORK PHASES START_S BUDGET_S FINAL(0|1)
(tests/gpu_check_report_test.py runs it on a made-up work dir.)"""
import json, os, sys, time, re, glob

work, phases, start, budget, final = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), sys.argv[5] == "1"
logs, met = os.path.join(work, "logs"), os.path.join(work, "metrics")


NUMERIC = {"top1", "eval_top1", "passed", "failed", "skipped", "sanitizer_errors"}


def num(k, v):
    """Counts and accuracies as numbers; versions ("12.10") stay strings."""
    if k not in NUMERIC:
        return v
    try:
        return float(v) if "." in v else int(v)
    except ValueError:
        return v


steps = []
for line in open(os.path.join(work, "steps.tsv"), errors="replace"):
    f = line.rstrip("\n").split("\t")
    if len(f) < 8:
        continue
    sid, group, title, status, rc, secs, tmo, note = f[:8]
    s = {"id": sid, "group": group, "title": title, "status": status,
         "rc": None if rc == "-" else int(rc), "seconds": float(secs), "timeout_s": int(tmo),
         "note": note, "log": f"logs/{sid}.log"}
    kvp = os.path.join(met, sid + ".kv")
    if os.path.exists(kvp):
        s["metrics"] = {}
        for kvl in open(kvp, errors="replace"):
            if "=" in kvl:
                k, v = kvl.rstrip("\n").split("=", 1)
                s["metrics"][k] = num(k, v)
    jp = os.path.join(met, sid + ".json")
    if os.path.exists(jp):
        try:
            s["result"] = json.loads(open(jp).read().strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    steps.append(s)

info = next((s.get("metrics", {}) for s in steps if s["id"] == "a_info"), {})
def impl_of(s):
    """vitrain's variants by step: f_vitrain_* is the build as it is; f_unfused_*, f_wmma_*, f_sync_*, f_tune_*,
    f_fp32res_*, f_unfusedrn_*, f_local_*, f_localfused_*, f_tanh_*, f_tanhsep_* and f_before_*
    (attention variants, the fp32 residual stream, the unfused residual + LayerNorm, the locality
    FFN fused and not, the tanh GELU in the GEMM epilogues and not, the BEFORE build)
    get their own column."""
    impl = s["result"].get("impl", "")
    var = s["id"].split("_")[1] if s["id"].startswith("f_") else "vitrain"
    return impl if var == "vitrain" else f"{impl}-{var}"


def kernels_text(result):
    """Which opt-in kernels a bench run or variant ran (vitrain's kernel_calls: op calls in eager
    passes and graph captures, not replays): "none" under a switch says its kernel declined and
    the row is the default's; "" where the line has no counts (the CPU, timm)."""
    calls = result.get("kernel_calls")
    if calls is None:
        return ""
    return ", ".join(f"{k} {n}" for k, n in calls.items() if n) or "none"


bench = [dict(s["result"], step=s["id"], impl=impl_of(s)) for s in steps
         if s["group"] in ("bench", "compile") and "result" in s and "img_per_s" in s["result"]]
# The interleaved variants (s_vvariants: one JSON line a variant, metrics/<step>.variants).
variant_rows = []
for s in steps:
    vp = os.path.join(met, s["id"] + ".variants")
    if os.path.exists(vp):
        for vl in open(vp, errors="replace"):
            try:
                variant_rows.append(dict(json.loads(vl), step=s["id"]))
            except ValueError:
                pass
counts = {k: sum(1 for s in steps if s["status"] == k) for k in ("PASS", "FAIL", "TIMEOUT", "SKIP")}
# FAIL if anything failed; INCOMPLETE if all that ran passed but some never ran (budget).
overall = ("FAIL" if counts["FAIL"] + counts["TIMEOUT"] or not steps else
           "INCOMPLETE" if counts["SKIP"] else "PASS")
res = {"phase": phases, "overall": overall, "counts": counts, "final": final,
       "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
       "elapsed_s": round(time.time() - start, 1), "budget_s": budget, "system": info,
       "steps": steps, "bench": bench, "variants": variant_rows}
tmp = os.path.join(work, "pack")
os.makedirs(tmp, exist_ok=True)
with open(os.path.join(tmp, "results.json"), "w") as f:
    json.dump(res, f, indent=1)

def g(k):
    return str(info.get(k) or "?")


L = []
L.append(f"# gpu_check {phases}: {overall}" + ("" if final else " (INCOMPLETE: still running or cut off)"))
L.append("")
L.append(f"{res['started']}, {res['elapsed_s']} s of a {budget} s budget. GPU: {g('gpu')} "
         f"({g('gpu_memory')}), driver {g('driver')}, CUDA {g('cuda_driver_api')}, nvcc {g('nvcc')}, "
         f"torch {g('torch')}, timm {g('timm')}; bundle commit {g('bundle_commit')[:12]}.")
L.append("")
L.append(" | ".join(f"{k} {v}" for k, v in counts.items()))
L.append("")
L.append("| step | status | s | note |")
L.append("|---|---|---:|---|")
for s in steps:
    L.append(f"| {s['id']} {s['title']} | {s['status']} | {s['seconds']:.1f} | {s['note']} |")
if bench:
    L.append("")
    L.append("Training-step throughput (one fixed synthetic batch; MFU = 3 x analytic forward FLOPs / 989 TFLOP/s):")
    L.append("")
    L.append("| model | batch | impl | img/s | ms/step | MFU | peak GiB | chunks: median img/s (spread) | "
             "opt-in kernels (op calls) | step |")
    L.append("|---|---:|---|---:|---:|---:|---:|---:|---|---|")
    def chunks(b):
        """vitrain's chunk rates (timm's bench has none): their median and (max - min) / median."""
        r = b.get("chunk_img_per_s") or []
        med = b.get("median_img_per_s")
        if not r or not med:
            return ""
        return f"{med} ({100 * (max(r) - min(r)) / med:.1f}%)"
    for b in sorted(bench, key=lambda b: (b.get("model", ""), b.get("impl", ""), b["step"])):
        mfu = b.get("mfu")
        L.append(f"| {b.get('model')} | {b.get('batch')} | {b.get('impl')} | {b.get('img_per_s')} | "
                 f"{b.get('ms_per_step')} | {'' if mfu is None else f'{100 * mfu:.1f}%'} | "
                 f"{b.get('peak_mem_gib', '')} | {chunks(b)} | {kernels_text(b)} | {b['step']} |")
    # Medians per model and implementation, and vitrain's speed relative to each torch mode.
    med = {}
    for b in bench:
        med.setdefault((b.get("model"), b.get("batch")), {}).setdefault(b.get("impl"), []).append(
            b["img_per_s"])
    impls = sorted({i for v in med.values() for i in v})
    L.append("")
    L.append("Median img/s (runs):")
    L.append("")
    L.append("| model | batch | " + " | ".join(impls) + " | vitrain vs the others |")
    L.append("|---|---:|" + "---:|" * len(impls) + "---|")
    for (m, bsz), by in sorted(med.items(), key=lambda x: str(x[0])):
        cells, mv = [], {}
        for i in impls:
            if i in by:
                v = sorted(by[i])
                mv[i] = v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
                cells.append(f"{mv[i]:.1f} ({len(v)})")
            else:
                cells.append("")
        # The build as it is against everything else: torch modes, attention variants, BEFORE.
        main = next((i for i in mv if i in ("vitrain-cuda", "vitrain-cpu", "vitrain-emu")), None)
        ratio = ", ".join(f"{mv[main] / v:.2f}x {i}" for i, v in mv.items()
                          if main and i != main and v > 0)
        L.append(f"| {m} | {bsz} | " + " | ".join(cells) + f" | {ratio} |")
if variant_rows:
    L += ["", "Kernel switches interleaved in one process (`bench --variant`; img/s a round, "
          "their median, and that over the default's; graphs: replays among the timed passes):",
          "",
          "| model | batch | variant | switches | img/s by round | median | vs default | MFU | "
          "graphs | opt-in kernels (op calls) | step |",
          "|---|---:|---|---|---|---:|---:|---:|---:|---|---|"]
    for v in variant_rows:
        env = " ".join(f"{k}={x}" for k, x in (v.get("env") or {}).items())
        rounds = ", ".join(str(x) for x in v.get("img_per_s_rounds", []))
        if v.get("error"):  # its runs ended in an error: the rounds before it, and why
            rounds += ("; " if rounds else "") + "FAILED: " + str(v["error"])[:120].replace("|", "/")
        mfu, ratio = v.get("mfu"), v.get("ratio_to_first")
        # Fewer replays than timed passes: graphs were off for some (a capture broke), so the
        # variant ran (partly) eagerly.
        graphs = (f"{v['graph_replays']}/{v['timed_passes']}" if "timed_passes" in v else "")
        L.append(f"| {v.get('model')} | {v.get('batch')} | {v.get('variant')} | {env} | {rounds} | "
                 f"{v.get('median_img_per_s', '')} | {'' if ratio is None else f'{ratio:.3f}x'} | "
                 f"{'' if mfu is None else f'{100 * mfu:.1f}%'} | {graphs} | {kernels_text(v)} | {v['step']} |")
# The sweep's variants: test top-1 over seeds (step ids w_NAME_SEED).
sweep = {}
for s in steps:
    t = s.get("metrics", {}).get("top1")
    if s["group"] == "sweep" and isinstance(t, (int, float)):
        sweep.setdefault(s["id"][2:].rsplit("_", 1)[0], []).append(t)
if sweep:
    L += ["", "Recipe variants (test top-1 %, over seeds):", "",
          "| variant | runs | mean | min | max |", "|---|---:|---:|---:|---:|"]
    for k, v in sweep.items():
        L.append(f"| {k} | {len(v)} | {sum(v) / len(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
fails = [s for s in steps if s["status"] in ("FAIL", "TIMEOUT")]
tails = {}
for s in fails:
    p = os.path.join(logs, s["id"] + ".log")
    if os.path.exists(p):
        tails[s["id"]] = [t.rstrip() for t in open(p, errors="replace").read().splitlines()
                          if t.strip()][-25:]
F = []
for s in fails:
    if s["id"] in tails:
        F.append("")
        F.append(f"### {s['id']} ({s['status']}, rc {s['rc']}): last lines of {s['log']}")
        F.append("")
        F.append("```")
        F.extend(t[:300] for t in tails[s["id"]])
        F.append("```")
with open(os.path.join(tmp, "summary.md"), "w") as f:
    f.write("\n".join(L + F) + "\n")
# The console copy: failures' tails first, shortened to fit, then the tables, so the device
# tool's 12,000-character output tail always holds the whole table.
table = "\n".join(L) + "\n"
room = max(0, 11000 - len(table))
per = room // max(1, len(tails))
C = []
for sid, tail in tails.items():
    lines = [t[:200] + "\n" for t in tail[-10:]]
    while lines and sum(map(len, lines)) > per - 80:
        lines.pop(0)  # whole lines, oldest first
    if lines:
        C.append(f"--- {sid}: last lines of logs/{sid}.log\n" + "".join(lines))
with open(os.path.join(tmp, "console.txt"), "w") as f:
    f.write("".join(C) + ("\n" if C else "") + table)
