"""torchvision/PIL reference for `vitrain bench-data`: the same training input pipeline on the
same ImageFolder: ImageFolder's PIL loader (open + convert RGB) -> RandomResizedCrop(size,
bilinear or bicubic) -> RandomHorizontalFlip -> ToTensor -> Normalize(ImageNet) -> batches.
Prints one JSON line like `vitrain bench-data --json`.

-j 0 (the default): one process on one thread, no DataLoader, torch.stack into batches (the
per-core rate of a DataLoader worker). -j N >= 1: a torch.utils.data.DataLoader with N worker
processes (persistent, prefetching, pinned memory with --device cuda), as training would use it.
--device cuda moves each batch (images and labels) to the GPU, so the rate is of batches there.

  /usr/bin/python3 bench/data_torch.py --data-dir /tmp/photos --img-size 224
  python3 bench/data_torch.py --data-dir /tmp/inet --img-size 224 -j 16 --device cuda --batches 64
"""
import argparse
import json
import os
import random
import time


def make_dataset(args):
    from torchvision import datasets, transforms
    interp = {"bilinear": transforms.InterpolationMode.BILINEAR,
              "bicubic": transforms.InterpolationMode.BICUBIC}[args.interpolation]
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.img_size, interpolation=interp),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])
    return datasets.ImageFolder(os.path.join(args.data_dir, "train"), transform=tf)


def in_process_batches(ds, B):
    """Endless batches built in this process, cycling over a fixed shuffled order."""
    import torch
    order = list(range(len(ds)))
    random.Random(42).shuffle(order)
    per_epoch = len(ds) // B
    i = 0
    while True:
        k = i % per_epoch
        samples = [ds[j] for j in order[k * B:(k + 1) * B]]
        yield torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples])
        i += 1


def loader_batches(ds, B, args):
    """Endless batches from a DataLoader; a new epoch starts when one runs out (a dataset
    smaller than the warm-up plus the timed batches must not end the run). The persistent
    workers carry over, but each new epoch starts with an empty prefetch queue."""
    import torch
    loader = torch.utils.data.DataLoader(
        ds, batch_size=B, shuffle=True, generator=torch.Generator().manual_seed(42),
        num_workers=args.workers, persistent_workers=True, prefetch_factor=args.prefetch,
        drop_last=True, pin_memory=args.device == "cuda")
    while True:
        yield from loader


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", required=True, help="ImageFolder root (uses its train/)")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("-b", "--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=16,
                    help="timed batches (with -j N, best a multiple of N: the workers deliver "
                         "their batches in rounds of N)")
    ap.add_argument("-j", "--workers", type=int, default=0,
                    help="DataLoader worker processes (0 = no DataLoader: this process, one "
                         "thread)")
    ap.add_argument("--prefetch", type=int, default=4, help="DataLoader prefetch_factor")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed batches first (default: 1 with -j 0, N with -j N)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: move each batch to the GPU (non_blocking) and time to its arrival")
    ap.add_argument("--interpolation", choices=["bilinear", "bicubic"], default="bilinear",
                    help="RandomResizedCrop's (bilinear is torchvision's default)")
    args = ap.parse_args()
    if args.workers < 0:
        ap.error("-j/--workers must be 0 or more")
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch.cuda.is_available() is false "
                         "(no GPU, or a CPU-only torch build)")
    # -j 0: the rate of one thread. -j N: the workers do the decoding and transforms (each set
    # to one thread by the DataLoader); the main process only collects batches, and more
    # threads there would only compete with the workers for the cores.
    torch.set_num_threads(1)
    ds = make_dataset(args)
    B = args.batch_size
    if B > len(ds):
        raise SystemExit(f"error: batch size {B} exceeds the {len(ds)} training images")
    N = args.workers
    # Warm-up, untimed. -j 0: one batch (page cache, lazy imports). -j N: the workers start
    # slowly (fork, imports, first files) and each builds whole batches, delivered in turn, so
    # N batches are one from every worker: after them all have started and are on their next.
    warmup = args.warmup if args.warmup is not None else max(N, 1)
    batches = loader_batches(ds, B, args) if N else in_process_batches(ds, B)
    cuda = args.device == "cuda"

    def step():
        x, y = next(batches)
        if cuda:
            x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.batches):
        step()
    if cuda:
        torch.cuda.synchronize()  # the last copies have landed
    sec = time.perf_counter() - t0
    ips = B * args.batches / sec
    print(json.dumps({"impl": "torchvision", "format": "folder", "img_size": args.img_size,
                      "workers": max(N, 1), "device": args.device,
                      "interpolation": args.interpolation, "img_per_s": round(ips, 1),
                      "img_per_s_per_worker": round(ips / max(N, 1), 1)}))


if __name__ == "__main__":
    main()
