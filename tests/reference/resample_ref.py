"""Reference outputs of torch.nn.functional.interpolate (align_corners=False) on channel grids,
for tests/test_resample_torch.cpp: bilinear and bicubic, with and without antialias, up and down.
Usage: /usr/bin/python3 resample_ref.py --out DIR   (writes DIR/resample.safetensors)"""
import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F

from torch_vit import write_safetensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    tensors, cases = {}, []
    C = 5
    for hi, wi, ho, wo in [(4, 4, 7, 7), (14, 14, 8, 8), (2, 2, 14, 14), (14, 14, 4, 4),
                           (3, 5, 6, 2), (7, 7, 7, 7)]:
        grid = torch.randn(1, C, hi, wi, dtype=torch.float32)
        for mode in ["bilinear", "bicubic"]:
            for aa in [False, True]:
                name = f"{mode}_{'aa' if aa else 'plain'}_{hi}x{wi}_to_{ho}x{wo}"
                out = F.interpolate(grid.double(), size=(ho, wo), mode=mode,
                                    align_corners=False, antialias=aa)
                # channels-last (h, w, C), as vitrain stores token grids
                tensors[name + ".src"] = grid[0].permute(1, 2, 0).numpy()
                tensors[name + ".dst"] = out[0].permute(1, 2, 0).numpy()
                cases.append(name)
    write_safetensors(os.path.join(args.out, "resample.safetensors"), tensors,
                      {"format": "pt", "cases": ",".join(cases)})


if __name__ == "__main__":
    main()
