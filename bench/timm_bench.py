"""timm's training step in several PyTorch modes, timed side by side in ONE process: the
baselines of issue 48's table (scripts/gpu_check.sh runs it beside `vitrain bench` in the same
device call).

Modes (--modes, comma-separated, in this order): eager; and torch.compile's default,
reduce-overhead (CUDA graphs, as vitrain replays its passes) and max-autotune-no-cudagraphs /
max-autotune. Each mode gets its own model (same seed) and torch.optim.AdamW(fused=True); a step
is the forward under bf16 autocast, cross-entropy, backward, the optimizer step and
zero_grad(set_to_none=True) on one synthetic batch made on the device. Each mode compiles and
warms up under a time cap (--compile-cap, and what --budget-s leaves): one that does not
finish in time says so ("not compiled within N s") and the others go on.

The timing: rounds over the compiled modes (the order rotated each round), a chunk of steps a
mode a round (about --chunk-s seconds), until every mode has --min-rounds chunks and
--seconds of timed steps. A mode's figure is the median of its chunks' img/s, so all modes
share the GPU's clocks and temperature as they are.

MFU = 3 x analytic forward FLOPs per image x img/s / --peak-tflops (989, dense bf16 of an
H100/H200 SXM), the FLOPs counted as bench/torch_train_bench.py and vitrain count them
(torch_train_bench.timm_model_flops). One JSON line a mode on stdout (--json), progress on
stderr. --no-timm uses torch_train_bench's torch.nn stand-in (smoke tests only).
"""
import argparse
import gc
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_train_bench as ttb  # noqa: E402  (beside this file, here and in the bundle's py/)


class OverCap(Exception):
    pass


def log(msg):
    print(f"timm_bench: {msg}", file=sys.stderr, flush=True)


def figure_name(mode):
    return "timm-eager" if mode == "eager" else f"timm-compile-{mode}"


class Mode:
    """One mode's model, optimizer and step, and its timed chunks."""

    def __init__(self, a, mode, torch, x, y):
        self.mode, self.rates, self.timed, self.loss = mode, [], 0.0, None
        torch.manual_seed(a.seed)
        model, _, self.flops, self.info = (ttb.build_fallback if a.no_timm else ttb.build_timm)(a)
        self.model = model.to(x.device).train()
        fused = dict(fused=True) if a.device == "cuda" else {}
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.05, **fused)
        self.fwd = self.model if mode == "eager" else torch.compile(self.model, mode=mode)
        mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
        graphs = mode in ("reduce-overhead", "max-autotune") and a.device == "cuda"
        ce = torch.nn.functional.cross_entropy

        def step():
            if graphs and mark is not None:
                mark()  # a new iteration: the graphs' outputs of the last may be overwritten
            with torch.autocast(a.device, dtype=torch.bfloat16):
                logits = self.fwd(x)
            loss = ce(logits.float(), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return loss

        self.step = step

    def chunk(self, n, sync, batch):
        sync()
        t = time.perf_counter()
        for _ in range(n):
            self.loss = self.step()
        sync()
        dt = time.perf_counter() - t
        self.rates.append(batch * n / dt)
        self.timed += dt


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--batch", "-b", type=int, default=256)
    ap.add_argument("--modes", default="eager,default,reduce-overhead,max-autotune-no-cudagraphs")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds a mode, at least")
    ap.add_argument("--chunk-s", type=float, default=0.5, help="about this long a chunk")
    ap.add_argument("--min-rounds", type=int, default=3)
    ap.add_argument("--compile-cap", type=float, default=150.0, help="s a mode's compile + warm-up")
    ap.add_argument("--budget-s", type=float, default=400.0, help="s for everything")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=ttb.PEAK_TFLOPS_DEFAULT)
    ap.add_argument("--no-timm", action="store_true", help="the torch.nn stand-in (smoke tests)")
    ap.add_argument("--img-size", type=int, default=0)
    ap.add_argument("--num-classes", type=int, default=0)
    ap.add_argument("--in-chans", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    t0 = time.monotonic()
    left = lambda: a.budget_s - (time.monotonic() - t0)  # noqa: E731
    modes = [m for m in a.modes.split(",") if m]
    recs = {m: {"impl": "timm", "name": figure_name(m), "mode": m, "model": a.model,
                "batch": a.batch} for m in modes}

    def emit():
        for m in modes:
            r = recs[m]
            print(json.dumps(r) if a.json else " ".join(f"{k}={v}" for k, v in r.items()),
                  flush=True)

    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        for r in recs.values():
            r["status"] = "error: CUDA is not available to torch"
        emit()
        return 3
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    common = {"torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"}
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
    probe = (ttb.build_fallback if a.no_timm else ttb.build_timm)(a)
    model0, img, flops, info = probe
    chans, classes = model0.patch_embed.proj.in_channels, model0.head.out_features
    del model0, probe
    g = torch.Generator(device=dev).manual_seed(a.seed + 1)  # synthetic data made on the device
    x = torch.randn(a.batch, chans, img, img, generator=g, device=dev)
    y = torch.randint(0, classes, (a.batch,), generator=g, device=dev)

    def on_alarm(signum, frame):
        raise OverCap()

    signal.signal(signal.SIGALRM, on_alarm)
    ready = []
    for i, m in enumerate(modes):
        r = recs[m]
        r.update(common, **{k: v for k, v in info.items() if k != "timm_overrides"})
        # Leave the timed rounds their time: every mode's seconds, half again, and a margin.
        room = left() - len(modes) * 1.5 * a.seconds - 10
        cap = min(a.compile_cap, room)
        if room < 5:
            r["status"] = f"not started: {max(0, left()):.0f} s of the budget left"
            continue
        t = time.monotonic()
        mode = None
        try:
            signal.alarm(max(1, int(cap)))
            mode = Mode(a, m, torch, x, y)
            for _ in range(3):  # the compile (and graph capture) happens here
                mode.step()
            sync()
            ts = time.perf_counter()
            for _ in range(3):
                mode.step()
            sync()
            mode.sec_per_step = (time.perf_counter() - ts) / 3
            signal.alarm(0)
        except OverCap:
            r["status"] = f"not {'warmed up' if m == 'eager' else 'compiled'} within {cap:.0f} s"
        except Exception as e:  # noqa: BLE001  (out of memory, a compile error: say which)
            signal.alarm(0)
            r["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        r["compile_s"] = round(time.monotonic() - t, 1)
        if "status" in r:
            log(f"{m}: {r['status']}")
            del mode
            if hasattr(torch, "_dynamo"):
                torch._dynamo.reset()
            gc.collect()
            if a.device == "cuda":
                torch.cuda.empty_cache()
            continue
        log(f"{m}: ready after {r['compile_s']} s, {1e3 * mode.sec_per_step:.1f} ms/step")
        mode.n = max(1, round(a.chunk_s / max(mode.sec_per_step, 1e-6)))
        ready.append(mode)

    rounds = 0
    while ready and left() > 2 and (rounds < a.min_rounds or
                                     any(md.timed < a.seconds for md in ready)):
        k = rounds % len(ready)
        for md in ready[k:] + ready[:k]:  # rotated: no mode always first after another
            md.chunk(md.n, sync, a.batch)
        rounds += 1
    for md in ready:
        r = recs[md.mode]
        rate = statistics.median(md.rates) if md.rates else None
        r.update({"status": "ok" if md.timed >= a.seconds else
                  f"timed only {md.timed:.1f} s (budget)", "img_per_s": rate and round(rate, 2),
                  "chunk_img_per_s": [round(v, 1) for v in md.rates], "chunks": len(md.rates),
                  "steps_per_chunk": md.n, "timed_s": round(md.timed, 2),
                  "fwd_gflops_per_img": round(md.flops / 1e9, 4)})
        if rate and a.device == "cuda":
            r["mfu"] = round(3 * md.flops * rate / (a.peak_tflops * 1e12), 4)
            r["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if md.loss is not None and not torch.isfinite(md.loss).item():
            r["status"] = "error: non-finite loss"
    emit()
    return 1 if any(str(r.get("status", "")).startswith("error") for r in recs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
