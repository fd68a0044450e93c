"""torchvision/PIL reference for `vitrain bench-data`: the same training input pipeline on the
same ImageFolder, in one process on one thread (the per-core rate of a DataLoader worker):
ImageFolder's PIL loader (open + convert RGB) -> RandomResizedCrop(size, bilinear) ->
RandomHorizontalFlip -> ToTensor -> Normalize(ImageNet) -> torch.stack into batches.
Prints one JSON line like `vitrain bench-data --json`.

  /usr/bin/python3 bench/data_torch.py --data-dir /tmp/photos --img-size 224
"""
import argparse
import json
import os
import random
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", required=True, help="ImageFolder root (uses its train/)")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("-b", "--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=16, help="timed batches")
    args = ap.parse_args()
    import torch
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.img_size,
                                     interpolation=transforms.InterpolationMode.BILINEAR),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])
    ds = datasets.ImageFolder(os.path.join(args.data_dir, "train"), transform=tf)
    order = list(range(len(ds)))
    random.Random(42).shuffle(order)
    B = args.batch_size
    if B > len(ds):
        raise SystemExit(f"error: batch size {B} exceeds the {len(ds)} training images")
    per_epoch = len(ds) // B

    def batch(i):
        k = i % per_epoch
        return torch.stack([ds[j][0] for j in order[k * B:(k + 1) * B]])

    batch(0)  # warm-up: page cache, lazy imports
    t0 = time.perf_counter()
    for i in range(1, args.batches + 1):
        batch(i)
    sec = time.perf_counter() - t0
    ips = B * args.batches / sec
    print(json.dumps({"impl": "torchvision", "format": "folder", "img_size": args.img_size,
                      "workers": 1, "img_per_s": round(ips, 1),
                      "img_per_s_per_worker": round(ips, 1)}))


if __name__ == "__main__":
    main()
