"""Reference model-EMA updates for tests/test_ema_torch.cpp: timm ModelEmaV3's decay schedule
(get_decay with update_after_step 0, min_decay 0, gamma 1, power 2/3) and its fp32 update,
ema.lerp_(weights, 1 - decay), over a few updates of changing weights.
Usage: /usr/bin/python3 ema_ref.py --out DIR   (writes DIR/ema.safetensors)"""
import argparse
import os

import numpy as np
import torch

from torch_vit import write_safetensors

DECAY = 0.9998
STEPS = 6


def get_decay(step, decay, warmup):
    """ModelEmaV3.get_decay as timm writes it, for step = num_updates (1 for the first)."""
    step = max(0, step - 0 - 1)
    if step <= 0:
        return 0.0
    if warmup:
        return max(min(1 - (1 + step / 1.0) ** (-2 / 3), decay), 0.0)
    return decay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    tensors, cases = {}, []
    for n in [1001, 65537]:  # odd sizes: vector body and scalar tail
        for warmup in [False, True]:
            name = f"n{n}_{'warmup' if warmup else 'plain'}"
            weights = torch.randn(n, dtype=torch.float32)
            ema = weights.clone()  # timm's deepcopy of the model at the start
            decays = []
            tensors[name + ".ema0"] = ema.numpy().copy()
            for step in range(1, STEPS + 1):
                weights = weights + 0.01 * torch.randn(n, dtype=torch.float32)
                d = get_decay(step, DECAY, warmup)
                decays.append(d)
                ema.lerp_(weights, 1.0 - d)
                tensors[f"{name}.weights{step}"] = weights.numpy().copy()
            tensors[name + ".ema"] = ema.numpy().copy()
            tensors[name + ".decays"] = np.array(decays, dtype=np.float64)
            cases.append(name)
    write_safetensors(os.path.join(args.out, "ema.safetensors"), tensors,
                      {"format": "pt", "cases": ",".join(cases)})


if __name__ == "__main__":
    main()
