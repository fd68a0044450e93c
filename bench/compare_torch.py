"""PyTorch eager training-step throughput for the same ViT vitrain trains (forward, backward,
AdamW step), float32 on the CPU, with the model class of tests/reference/torch_vit.py. Prints one
JSON line on stdout; torch's build configuration (BLAS backend) goes to stderr. Used by
bench/compare_cpu.sh, which runs vitrain's own bench in the same session for
docs/benchmarks.md. The defaults are vitrain's `vit_bench_cpu` preset and `vitrain bench`'s step
(no grad clipping; --clip-grad adds it).
GFLOP/s counts 3 x the analytic forward FLOPs per image (2 per multiply-add: patch embedding,
qkv, QK^T, PV, proj, fc1, fc2, depthwise conv for the local FFN, head), the same formula as
ModelConfig::forward_flops_per_image.
Run with Debian's interpreter: /usr/bin/python3 bench/compare_torch.py [--threads 2] ...
"""
import argparse
import json
import os
import statistics
import sys
import time


def loaded_blas():
    """The BLAS/LAPACK shared libraries mapped into this process (Linux): Debian's torch reports
    BLAS_INFO=generic and calls whatever libblas.so.3 resolves to (OpenBLAS here)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in libs if any(k in os.path.basename(p).lower()
                                         for k in ("blas", "lapack", "mkl")))


torch = torch_vit = None  # imported in main(), after the thread environment is set


def init_weights(model):
    """timm-like init (trunc normal std .02 for Linear weights and pos_embed, zero biases, unit
    LayerNorm), so the run sees realistic magnitudes rather than zeros."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif name in ("pos_embed", "cls_token") or p.ndim == 2:
                torch.nn.init.trunc_normal_(p, std=0.02)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embed-dim", type=int, default=192)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--mlp-ratio", type=float, default=4.0)
    ap.add_argument("--img", type=int, default=32)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--in-chans", type=int, default=3)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--classifier", choices=["token", "avg"], default="avg")
    ap.add_argument("--ffn", choices=["mlp", "local"], default="mlp")
    ap.add_argument("--layer-scale", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--clip-grad", type=float, default=0.0, help="0 = no clipping")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.threads < 1:
        ap.error("--steps, --batch and --threads must be positive, --warmup non-negative")

    # Before torch loads: OpenBLAS sizes its own thread pool from the environment.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(a.threads))
    global torch, torch_vit
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "reference"))
    import torch_vit

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(torch.__config__.show(), file=sys.stderr)
    torch.ones(64, 64) @ torch.ones(64, 64)  # make sure the BLAS library is loaded
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; BLAS libraries loaded: "
          + (", ".join(loaded_blas()) or "unknown"), file=sys.stderr)

    model = torch_vit.ViT(img_size=a.img, patch_size=a.patch, in_chans=a.in_chans,
                          embed_dim=a.embed_dim, depth=a.depth, num_heads=a.heads,
                          mlp_ratio=a.mlp_ratio, num_classes=a.classes, classifier=a.classifier,
                          ffn=a.ffn, qkv_bias=True, layer_scale_init=a.layer_scale)
    init_weights(model)
    model.train()
    opt = torch.optim.AdamW(torch_vit.decay_groups(model, 0.05), lr=1e-4, betas=(0.9, 0.999),
                            eps=1e-8)
    x = torch.randn(a.batch, a.in_chans, a.img, a.img)
    t = torch.nn.functional.one_hot(torch.randint(0, a.classes, (a.batch,)), a.classes).float()

    def step():
        opt.zero_grad()
        torch_vit.soft_cross_entropy(model(x), t).backward()
        if a.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad)
        opt.step()

    for _ in range(a.warmup):
        step()
    times = []
    t_all = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    dt = (time.perf_counter() - t_all) / a.steps
    flops = 3 * torch_vit.forward_flops_per_image(a.img, a.patch, a.in_chans, a.embed_dim,
                                                  a.depth, a.mlp_ratio, a.classes,
                                                  a.classifier, a.ffn)
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "batch": a.batch,
                      "threads": a.threads, "img_per_s": round(a.batch / dt, 2),
                      "ms_per_step": round(dt * 1e3, 2),
                      "ms_per_step_median": round(statistics.median(times) * 1e3, 2),
                      "gflops": round(flops * a.batch / dt / 1e9, 2)}))


if __name__ == "__main__":
    main()
