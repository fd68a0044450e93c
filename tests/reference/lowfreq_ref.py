"""Reference outputs for tests/test_lowfreq_torch.cpp: EfficientTrain's FFT low-frequency crop
(torch.fft, unshifted spectrum, four corner blocks, scaled by (B/S)^2, real part of ifft2) and
antialiased bilinear down-sampling (F.interpolate(mode='bilinear', antialias=True,
align_corners=False)) on (C, S, S) float images.
Usage: /usr/bin/python3 lowfreq_ref.py --out DIR   (writes DIR/lowfreq.safetensors)"""
import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F

from torch_vit import write_safetensors


def freq_crop(x, B):
    """x: (N, C, S, S) -> (N, C, B, B), EfficientTrain's low-frequency crop."""
    S = x.shape[-1]
    b = B // 2
    f = torch.fft.fft2(x)
    g = torch.zeros(x.shape[:-2] + (B, B), dtype=f.dtype)
    g[..., :b, :b] = f[..., :b, :b]
    g[..., -b:, :b] = f[..., -b:, :b]
    g[..., :b, -b:] = f[..., :b, -b:]
    g[..., -b:, -b:] = f[..., -b:, -b:]
    g = g * (B / S) ** 2
    return torch.fft.ifft2(g).real


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    tensors, fft_cases, aa_cases = {}, [], []
    # (C, S, bandwidths for the FFT crop, sizes for the down-sampling)
    for C, S, fft_bs, aa_bs in [(3, 32, [8, 16, 24, 30], [8, 12, 16, 24, 31]),
                                (3, 224, [96, 160, 192], [96, 160, 192, 112]),
                                (2, 15, [4, 6, 14], [1, 4, 7, 15]),
                                (1, 6, [2, 4, 6], [2, 3, 5])]:
        # smooth structure plus noise, with a non-zero mean per channel
        yy, xx = torch.meshgrid(torch.arange(S, dtype=torch.float64),
                                torch.arange(S, dtype=torch.float64), indexing="ij")
        img = torch.randn(C, S, S, dtype=torch.float64)
        for c in range(C):
            img[c] += torch.sin(xx * (0.2 + 0.1 * c)) + torch.cos(yy * 0.3) + 0.5 * c - 0.3
        img = img.float()
        key = f"c{C}_s{S}"
        tensors[key] = img.numpy()
        for B in fft_bs:
            name = f"fft_{key}_b{B}"
            tensors[name] = freq_crop(img.double()[None], B)[0].float().numpy()
            fft_cases.append(name)
        for B in aa_bs:
            name = f"aa_{key}_b{B}"
            out = F.interpolate(img.double()[None], size=(B, B), mode="bilinear",
                                align_corners=False, antialias=True)
            tensors[name] = out[0].float().numpy()
            aa_cases.append(name)
    write_safetensors(os.path.join(args.out, "lowfreq.safetensors"), tensors,
                      {"format": "pt", "fft_cases": ",".join(fft_cases),
                       "aa_cases": ",".join(aa_cases)})


if __name__ == "__main__":
    main()
