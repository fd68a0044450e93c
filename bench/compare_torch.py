"""PyTorch eager training-step throughput for the same ViT vitrain trains (forward, backward,
AdamW step), float32 on the CPU. Prints one JSON line. Used by bench/compare_cpu.sh, which runs
vitrain's own bench in the same session for docs/benchmarks.md.
Run with Debian's interpreter: /usr/bin/python3 bench/compare_torch.py [--threads 2] ...
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import torch_vit  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--embed-dim", type=int, default=192)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--img", type=int, default=32)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--in-chans", type=int, default=3)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--classifier", default="avg")
    ap.add_argument("--ffn", default="mlp")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(torch.__config__.show(), file=sys.stderr)
    model = torch_vit.ViT(img_size=a.img, patch_size=a.patch, in_chans=a.in_chans,
                          embed_dim=a.embed_dim, depth=a.depth, num_heads=a.heads,
                          num_classes=a.classes, classifier=a.classifier, ffn=a.ffn)
    opt = torch.optim.AdamW(torch_vit.decay_groups(model, 0.05), lr=1e-4)
    x = torch.randn(a.batch, a.in_chans, a.img, a.img)
    t = torch.nn.functional.one_hot(torch.randint(0, a.classes, (a.batch,)), a.classes).float()

    def step():
        opt.zero_grad()
        torch_vit.soft_cross_entropy(model(x), t).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = (time.perf_counter() - t0) / a.steps
    flops = 3 * torch_vit.forward_flops_per_image(a.img, a.patch, a.in_chans, a.embed_dim,
                                                  a.depth, 4.0, a.classes, a.classifier, a.ffn)
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "batch": a.batch,
                      "threads": a.threads, "img_per_s": round(a.batch / dt, 2),
                      "ms_per_step": round(dt * 1e3, 2),
                      "gflops": round(flops * a.batch / dt / 1e9, 2)}))


if __name__ == "__main__":
    main()
