"""Training-step throughput of a timm Vision Transformer in PyTorch on one GPU: the baseline that
`vitrain bench --device cuda` is compared against (scripts/gpu_check.sh runs both on the same GPU,
interleaved). One step = forward under bf16 autocast, cross-entropy, backward,
torch.optim.AdamW(fused=True), zero_grad(set_to_none=True), on one fixed synthetic batch (random
normal images, random labels), as `vitrain bench` does.

--mode eager runs the model as is; --mode compile wraps it in torch.compile (default mode
max-autotune). Compilation happens in the warm-up steps and is bounded by --compile-timeout
(default 240 s): past it the script prints a JSON line with "error" and exits 4, so a compile
cannot eat a device call's budget. VIT_TORCH_SKIP_COMPILE=1 makes --mode compile print a
"skipped" line and exit 0 without compiling.

MFU = 3 x forward FLOPs per image x img/s / peak (default 989 TFLOP/s, the H100/H200 SXM dense
bf16 rate). Forward FLOPs are counted analytically from the built model, multiply-adds = 2:
patch embedding, qkv, QK^T, PV, proj, fc1, fc2, head (LayerNorm, softmax, GELU, the loss and
the optimizer are not counted): the formula of vitrain's ModelConfig::forward_flops_per_image,
so both report MFU on the same FLOP count.

vitrain presets that are not timm names (vit_tiny_patch4_32, ...) map to a timm entry point with
overrides (img/patch size, depth, classifier) giving the same architecture.

--no-timm: a stand-in ViT from tests/reference/torch_vit.py (torch.nn only, the same block
structure), for smoke-testing this script where timm is not installed. Its numbers are NOT a timm
baseline; the JSON says impl "torchnn-fallback-*". Without timm and without --no-timm the script
exits 2. --device cpu runs on the CPU (bf16 CPU autocast, or none with --precision fp32).

Prints one JSON line on stdout; progress goes to stderr.
"""
import argparse
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEAK_TFLOPS_DEFAULT = 989.0  # H100 SXM / H200 dense bf16 (datasheet, no sparsity)

# vitrain presets without a timm name: (timm entry point, overrides). Values from
# src/model/config.cpp; global_pool='avg' + class_token=False is vitrain's avg classifier
# (mean of the patch tokens, then fc_norm).
VITRAIN_PRESETS = {
    "vit_tiny_patch4_32": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, depth=9,
                                                        num_classes=10, global_pool="avg",
                                                        class_token=False)),
    "vit_small_patch4_32": ("vit_small_patch16_224", dict(img_size=32, patch_size=4, depth=9,
                                                          num_classes=10, global_pool="avg",
                                                          class_token=False)),
    "vit_tiny_patch4_28": ("vit_tiny_patch16_224", dict(img_size=28, patch_size=4, in_chans=1,
                                                        depth=6, num_classes=10,
                                                        global_pool="avg", class_token=False)),
    "vit_fmnist_tiny": ("vit_tiny_patch16_224", dict(img_size=28, patch_size=4, in_chans=1,
                                                     embed_dim=96, depth=4, num_heads=3,
                                                     num_classes=10, global_pool="avg",
                                                     class_token=False)),
    "vit_bench_cpu": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, depth=6,
                                                   num_classes=10, global_pool="avg",
                                                   class_token=False)),
}

# The --no-timm stand-in: architecture by name (timm's ViT-Ti/S/B at 224 and the presets above).
FALLBACK_ARCH = {
    "vit_tiny_patch16_224": dict(img_size=224, patch_size=16, in_chans=3, embed_dim=192, depth=12,
                                 num_heads=3, num_classes=1000, classifier="token"),
    "vit_small_patch16_224": dict(img_size=224, patch_size=16, in_chans=3, embed_dim=384,
                                  depth=12, num_heads=6, num_classes=1000, classifier="token"),
    "vit_base_patch16_224": dict(img_size=224, patch_size=16, in_chans=3, embed_dim=768, depth=12,
                                 num_heads=12, num_classes=1000, classifier="token"),
    "vit_tiny_patch4_32": dict(img_size=32, patch_size=4, in_chans=3, embed_dim=192, depth=9,
                               num_heads=3, num_classes=10, classifier="avg"),
}


def log(msg):
    print(f"torch_train_bench: {msg}", file=sys.stderr, flush=True)


def emit(record, as_json):
    if as_json:
        print(json.dumps(record), flush=True)
    else:
        print(" ".join(f"{k}={v}" for k, v in record.items()), flush=True)


def vit_forward_flops(img, patch, in_chans, dim, depth, hidden, prefix, classes):
    """Forward FLOPs per image, multiply-add = 2 (see the module docstring for what counts)."""
    n_p = (img // patch) ** 2
    n = n_p + prefix
    f = 2.0 * n_p * in_chans * patch * patch * dim                # patch embedding
    block = n * (2 * dim * 3 * dim + 2 * dim * dim)               # qkv, proj
    block += n * (2 * dim * hidden + 2 * hidden * dim)            # fc1, fc2
    block += 2 * (2 * n * n * dim)                                # QK^T, PV
    return f + depth * block + 2 * dim * classes                  # + head


def timm_model_flops(model):
    """Reads the architecture off a built timm VisionTransformer (so --img-size and overrides are
    counted as built), then applies vit_forward_flops."""
    pe = model.patch_embed
    patch = pe.patch_size[0] if isinstance(pe.patch_size, (tuple, list)) else pe.patch_size
    grid = pe.grid_size[0] if isinstance(pe.grid_size, (tuple, list)) else pe.grid_size
    if getattr(model, "num_prefix_tokens", None) is None or not hasattr(model, "blocks"):
        raise ValueError("not a timm VisionTransformer: no FLOP formula for it")
    return vit_forward_flops(grid * patch, patch, pe.proj.in_channels, model.embed_dim,
                             len(model.blocks), model.blocks[0].mlp.fc1.out_features,
                             model.num_prefix_tokens, model.num_classes)


def with_overrides(kw, a):
    """kw plus the image size, class count and input channels given on the command line."""
    for key in ("img_size", "num_classes", "in_chans"):
        if getattr(a, key):
            kw[key] = getattr(a, key)
    return kw


def build_timm(a):
    import timm
    name, kw = a.model, {}
    if name in VITRAIN_PRESETS:
        name, kw = VITRAIN_PRESETS[a.model][0], dict(VITRAIN_PRESETS[a.model][1])
    kw = with_overrides(kw, a)
    model = timm.create_model(name, pretrained=False, **kw)
    size = model.patch_embed.img_size
    img = size[0] if isinstance(size, (tuple, list)) else size
    return model, img, timm_model_flops(model), {"timm": timm.__version__, "timm_entry": name,
                                                 "timm_overrides": kw}


def build_fallback(a):
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
    sys.path.insert(0, HERE)  # the bundle keeps torch_vit.py beside this script
    import torch_vit
    if a.model not in FALLBACK_ARCH:
        raise SystemExit(f"--no-timm knows only {', '.join(sorted(FALLBACK_ARCH))}")
    c = with_overrides(dict(FALLBACK_ARCH[a.model]), a)
    model = torch_vit.ViT(mlp_ratio=4.0, ffn="mlp", qkv_bias=True, **c)
    flops = vit_forward_flops(c["img_size"], c["patch_size"], c["in_chans"], c["embed_dim"],
                              c["depth"], 4 * c["embed_dim"],
                              1 if c["classifier"] == "token" else 0, c["num_classes"])
    return model, c["img_size"], flops, {"fallback": "tests/reference/torch_vit.py ViT "
                                                     "(torch.nn only), not timm: smoke test only"}


class CompileTimeout(Exception):
    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_small_patch16_224",
                    help="timm model name or a vitrain preset (vit_tiny_patch4_32, ...)")
    ap.add_argument("--batch", "-b", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile: >= 2)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--compile-mode", default="max-autotune",
                    help="torch.compile mode (default max-autotune)")
    ap.add_argument("--compile-timeout", type=float, default=240.0,
                    help="seconds allowed for compilation + warm-up (0 = no limit)")
    ap.add_argument("--img-size", type=int, default=0, help="0 = the model's")
    ap.add_argument("--num-classes", type=int, default=0, help="0 = the model's")
    ap.add_argument("--in-chans", type=int, default=0, help="0 = the model's (3 for timm's)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                    help="bf16: autocast to bfloat16; fp32: no autocast (TF32 off)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS_DEFAULT,
                    help="the MFU denominator (CUDA only)")
    ap.add_argument("--no-timm", action="store_true",
                    help="use the torch.nn stand-in ViT instead of timm (smoke tests only)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON line (else key=value)")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, one more step under torch.profiler: its kernel table "
                         "(self device time, top 30) on stderr")
    a = ap.parse_args()
    if a.steps < 1 or a.batch < 1 or a.warmup < 0:
        ap.error("--steps and --batch must be positive, --warmup non-negative")

    impl = ("torchnn-fallback-" if a.no_timm else "timm-") + a.mode
    rec = {"impl": impl, "model": a.model, "batch": a.batch, "device": a.device,
           "precision": a.precision}
    if a.mode == "compile" and os.environ.get("VIT_TORCH_SKIP_COMPILE", "0") not in ("", "0"):
        rec["skipped"] = "VIT_TORCH_SKIP_COMPILE is set"
        emit(rec, a.json)
        return 0

    import torch
    import torch.nn.functional as F
    rec["torch"] = torch.__version__
    if not a.no_timm:
        import importlib.util
        if importlib.util.find_spec("timm") is None:
            log("timm is not installed: no baseline to measure (--no-timm runs a torch.nn "
                "stand-in for smoke tests)")
            rec["error"] = "timm not installed"
            emit(rec, a.json)
            return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        log("CUDA is not available to torch")
        rec["error"] = "no CUDA device"
        emit(rec, a.json)
        return 3
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if a.device == "cuda":
        # fp32 mode must be real fp32 (vitrain's fp32 mode never uses TF32).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        rec["gpu"] = torch.cuda.get_device_name(0)
        rec["cuda"] = torch.version.cuda

    model, img, fwd_flops, info = (build_fallback if a.no_timm else build_timm)(a)
    rec.update(info)
    model = model.to(dev).train()
    classes = model.head.out_features
    chans = model.patch_embed.proj.in_channels
    rec["img_size"] = img
    rec["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 3)

    # fused=True on CUDA only: the CPU smoke test runs on torches (Debian's 1.13) without it.
    fused = dict(fused=True) if a.device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, **fused)
    rec["optimizer"] = "AdamW(fused)" if fused else "AdamW"

    fwd = model
    if a.mode == "compile":
        if not hasattr(torch, "compile"):
            rec["error"] = "torch.compile needs torch >= 2.0"
            emit(rec, a.json)
            return 3
        fwd = torch.compile(model, mode=a.compile_mode)
        rec["compile_mode"] = a.compile_mode

    g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    x = torch.randn(a.batch, chans, img, img, generator=g).to(dev)
    y = torch.randint(0, classes, (a.batch,), generator=g).to(dev)
    use_amp = a.precision == "bf16"
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def step():
        if a.mode == "compile" and mark_step is not None and a.device == "cuda":
            mark_step()  # max-autotune uses CUDA graphs: one training iteration per graph step
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=use_amp):
            logits = fwd(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    # Warm-up (and compilation), bounded by an alarm so a slow max-autotune cannot run on.
    def on_alarm(signum, frame):
        raise CompileTimeout()

    limit = a.compile_timeout if a.mode == "compile" else 0
    t0 = time.perf_counter()
    if limit > 0:
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(max(1, int(limit)))
    try:
        for _ in range(max(a.warmup, 2 if a.mode == "compile" else 0)):
            loss = step()
        sync()
    except CompileTimeout:
        rec["error"] = f"compile + warm-up did not finish within {limit:.0f} s"
        emit(rec, a.json)
        sys.stdout.flush()
        os._exit(4)  # inductor's worker pool may not shut down promptly: leave at once
    finally:
        if limit > 0:
            signal.alarm(0)
    rec["warmup_s"] = round(time.perf_counter() - t0, 2)
    log(f"{impl} {a.model} batch {a.batch}: warm-up {rec['warmup_s']} s")

    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        ev[0].record()
        for i in range(a.steps):
            loss = step()
            ev[i + 1].record()
        sync()
        per_step = [ev[i].elapsed_time(ev[i + 1]) for i in range(a.steps)]
        total_ms = ev[0].elapsed_time(ev[-1])
    else:
        per_step = []
        t_all = time.perf_counter()
        for _ in range(a.steps):
            t = time.perf_counter()
            loss = step()
            per_step.append((time.perf_counter() - t) * 1e3)
        total_ms = (time.perf_counter() - t_all) * 1e3
    if not torch.isfinite(loss).item():
        log("the loss is not finite")
        rec["error"] = "non-finite loss"

    ms = total_ms / a.steps
    img_s = a.batch * 1e3 / ms
    rec.update({
        "img_per_s": round(img_s, 2),
        "ms_per_step": round(ms, 3),
        "ms_per_step_median": round(statistics.median(per_step), 3),
        "steps": a.steps,
        "warmup": a.warmup,
        "fwd_gflops_per_img": round(fwd_flops / 1e9, 4),
        "gflops": round(3 * fwd_flops * img_s / 1e9, 2),
        "flops_note": "3 x analytic forward FLOPs (patch embed, qkv, QK^T, PV, proj, fc1, fc2, "
                      "head; multiply-add = 2)",
        "loss": round(float(loss.item()), 4),
    })
    if a.device == "cuda":
        rec["mfu"] = round(3 * fwd_flops * img_s / (a.peak_tflops * 1e12), 4)
        rec["peak_tflops"] = a.peak_tflops
        rec["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        rec["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
        with profile(activities=acts) as prof:
            step()
            sync()
        key = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70),
              file=sys.stderr)
    emit(rec, a.json)
    return 1 if "error" in rec else 0


if __name__ == "__main__":
    sys.exit(main())
