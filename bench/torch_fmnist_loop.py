"""The default Fashion-MNIST recipe trained by a plain PyTorch loop: the other side of issue 48's
time-to-accuracy table (scripts/gpu_check.sh tta runs it beside `vitrain train` on one GPU).

The model is tests/reference/torch_vit.py's ViT, the module the C++ engine is checked against
(vit_fmnist_hybrid: the conv stem, the locality FFN, the pooled classifier), with attention
through F.scaled_dot_product_attention where torch has it (as timm's fused_attn). The recipe
(recipes/fmnist.yaml, flat `key: value` lines) gives epochs, batch, lr, min_lr, warmup_epochs,
warmup_lr, weight_decay, smoothing, hflip and crop_pad; a key with a value this loop does not
implement is an error, not ignored. As `vitrain train` does: the training images normalised by
their own per-channel mean and std, a fresh permutation per epoch, floor(N / batch) updates per
epoch, AdamW (0.9, 0.999, eps 1e-8; no decay for 1-d tensors, biases and pos_embed) with the
learning rate set before every update (linear warm-up, then cosine to min_lr over all updates:
torch_vit.cosine_lr), label-smoothed cross-entropy, vitrain's init distributions, bf16 autocast
on CUDA (--precision), fused AdamW on CUDA where torch has it, an evaluation on the test split
after every epoch. The data set lives on the device for the whole run (no loader).

Prints one JSON line per epoch, {"impl": "torch-loop", "epoch", "top1", "eval_loss",
"train_loss", "lr", "elapsed_s", "train_s"}, then a summary line with "final": true. elapsed_s
runs from the first update (after the data is on the device and the model and optimizer are
built, as vitrain's summary.csv `seconds`) to the end of that epoch's evaluation; setup_s in the
summary is the time before it (imports, device start, data). Progress goes to stderr.

  python3 bench/torch_fmnist_loop.py --device cuda
  /usr/bin/python3 bench/torch_fmnist_loop.py --device cpu --epochs 1 --limit 2048  # smoke test
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

T_PROCESS = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")

# vitrain presets (src/model/config.cpp) this loop builds: torch_vit.ViT arguments.
PRESETS = {
    "vit_fmnist_tiny": dict(ffn="mlp", stem="patch"),
    "vit_fmnist_local": dict(ffn="local", stem="patch"),
    "vit_fmnist_hybrid": dict(ffn="local", stem="conv"),
}
FMNIST_ARCH = dict(img_size=28, patch_size=4, in_chans=1, embed_dim=96, depth=4, num_heads=3,
                   num_classes=10, classifier="avg")
# Recipe keys and the values this loop implements beyond the numbers it reads.
READ = {"model", "batch_size", "epochs", "lr", "min_lr", "warmup_epochs", "warmup_lr",
        "weight_decay", "smoothing", "hflip", "crop_pad", "data_dir"}
NEUTRAL = {"opt": "adamw", "drop_path": "0", "clip_grad": "0", "mixup": "0", "cutmix": "0",
           "reprob": "0", "aa": "", "color_jitter": "0", "model_ema": "false",
           "grad_accum_steps": "1", "aug_repeats": "1", "curriculum": "none", "budget": "",
           "eval_interval": "1", "precision": "bf16", "seed": None, "output": None,
           "experiment": None, "log_interval": None, "workers": None, "device": None}


def fail(msg):
    print(f"torch_fmnist_loop: {msg}", file=sys.stderr)
    sys.exit(2)


def read_recipe(path):
    """Flat `key: value  # comment` lines (the recipes' YAML subset) as strings."""
    out = {}
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"cannot read the recipe: {e}")
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" not in line:
            fail(f"{path}: not a `key: value` line: {line}")
        k, v = (s.strip() for s in line.split(":", 1))
        out[k] = v.strip('"')
    for k, v in out.items():
        if k in READ or (k in NEUTRAL and (NEUTRAL[k] is None or v == NEUTRAL[k])):
            continue
        fail(f"{path}: {k}: {v} is not implemented by this loop")
    return out


def read_idx(path):
    """An unsigned-byte IDX file (.gz or not) as a numpy array."""
    import numpy as np
    for p in (path, path + ".gz"):
        if os.path.isfile(p):
            with (gzip.open(p, "rb") if p.endswith(".gz") else open(p, "rb")) as f:
                data = f.read()
            break
    else:
        fail(f"{path}[.gz] not found")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        fail(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def vitrain_init(model, torch):
    """The distributions of src/model/params.cpp's init_params (not its random stream)."""
    conv_stem = hasattr(model.patch_embed, "stem")
    fan_patch = model.patch_embed.proj.weight[0].numel()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(("norm1.weight", "norm2.weight")):
                p.fill_(1.0)
            elif ".stem." in name and name.endswith("conv.weight"):  # fan = output channels
                p.normal_(0.0, math.sqrt(2.0 / p.shape[0]))
            elif name == "patch_embed.proj.weight" and conv_stem:  # the stem's 1x1
                p.normal_(0.0, math.sqrt(1.0 / p.shape[0]))
            elif name.startswith("patch_embed.proj.") and not conv_stem:  # bias included
                p.uniform_(-1.0 / math.sqrt(fan_patch), 1.0 / math.sqrt(fan_patch))
            elif name.endswith("dwconv.weight"):
                p.uniform_(-1.0 / 3.0, 1.0 / 3.0)
            elif name == "cls_token":
                p.normal_(0.0, 1e-6)
            elif p.ndim >= 2:  # pos_embed, qkv, proj, fc1, fc2, head
                torch.nn.init.trunc_normal_(p, std=0.02, a=-2.0, b=2.0)
            else:
                p.zero_()


def use_sdpa(model, torch):
    """Attention through F.scaled_dot_product_attention (torch >= 2.0): the same function as
    torch_vit's explicit softmax, in the fused kernels a PyTorch user gets."""
    F = torch.nn.functional
    if not hasattr(F, "scaled_dot_product_attention"):
        return False

    def forward(self, x):  # (B, N, C)
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))

    for blk in model.blocks:
        blk.attn.forward = forward.__get__(blk.attn)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=os.path.join(ROOT, "recipes", "fmnist.yaml"))
    ap.add_argument("--data-dir", help="IDX folder (default: the recipe's data_dir)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="bf16: autocast; fp32: none; auto: bf16 on CUDA, fp32 on the CPU "
                    "(torch 1.13's CPU autocast leaves the stem's LayerNorm in bf16 and fails)")
    ap.add_argument("--epochs", type=int, help="override the recipe's epochs")
    ap.add_argument("--limit", type=int, default=0, help="the first N training images (0 = all)")
    ap.add_argument("--eval-limit", type=int, default=0, help="the first N test images (0 = all)")
    ap.add_argument("--eval-batch", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--attention", choices=["sdpa", "math"], default="sdpa",
                    help="math: torch_vit's explicit softmax(QK^T)V")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (its compile time counts in elapsed_s)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    a = ap.parse_args()
    if a.precision == "auto":
        a.precision = "bf16" if a.device == "cuda" else "fp32"
    r = read_recipe(a.recipe)
    if r.get("model") not in PRESETS:
        fail(f"model {r.get('model')!r}: this loop builds {', '.join(PRESETS)}")
    if float(r.get("crop_pad", 0)) > 0:
        fail("crop_pad > 0 is not implemented by this loop")
    batch, epochs = int(r["batch_size"]), a.epochs or int(r["epochs"])
    lr, min_lr, warmup_lr = float(r["lr"]), float(r["min_lr"]), float(r["warmup_lr"])
    wd, smoothing = float(r["weight_decay"]), float(r.get("smoothing", 0))
    hflip = max(0.0, float(r.get("hflip", -1)))  # -1: none for in-memory data, as vitrain

    import numpy as np
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    sys.path.insert(0, HERE)  # a bundle keeps torch_vit.py beside this script
    import torch_vit

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but torch sees no GPU")
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    data_dir = a.data_dir or r.get("data_dir") or "/usr/share/datasets/fashion-mnist"
    xs, ys = (read_idx(os.path.join(data_dir, f"{s}-images-idx3-ubyte")) for s in ("train", "t10k"))
    ls, lt = (read_idx(os.path.join(data_dir, f"{s}-labels-idx1-ubyte")) for s in ("train", "t10k"))
    if a.limit > 0:
        xs, ls = xs[:a.limit], ls[:a.limit]
    if a.eval_limit > 0:
        ys, lt = ys[:a.eval_limit], lt[:a.eval_limit]
    n = len(xs)
    upe = n // batch
    if upe == 0:
        fail(f"batch {batch} exceeds the {n} training images")
    # vitrain's channel_stats: mean and std of pixels / 255 over the training images.
    px = xs.astype(np.float64) / 255.0
    mean, std = float(px.mean()), float(px.std()) or 1.0
    del px

    def to_dev(u8):  # (N, 1, 28, 28) normalised float32 on the device
        t = torch.from_numpy(np.array(u8)).to(dev).float().div_(255.0)
        return t.sub_(mean).div_(std).unsqueeze(1)

    x_train, x_test = to_dev(xs), to_dev(ys)
    y_train = torch.from_numpy(ls.astype(np.int64)).to(dev)
    y_test = torch.from_numpy(lt.astype(np.int64)).to(dev)

    model = torch_vit.ViT(**FMNIST_ARCH, **PRESETS[r["model"]])
    vitrain_init(model, torch)
    model = model.to(dev)
    sdpa = a.attention == "sdpa" and use_sdpa(model, torch)
    fused = dev.type == "cuda"
    try:
        opt = torch.optim.AdamW(torch_vit.decay_groups(model, wd), lr=warmup_lr,
                                betas=(0.9, 0.999), eps=1e-8, fused=fused or None)
    except (TypeError, RuntimeError):  # torch without fused AdamW
        fused = False
        opt = torch.optim.AdamW(torch_vit.decay_groups(model, wd), lr=warmup_lr,
                                betas=(0.9, 0.999), eps=1e-8)
    step_model = torch.compile(model) if a.compile else model
    amp = a.precision == "bf16"

    def autocast():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def evaluate():
        model.eval()
        correct, loss = torch.zeros((), device=dev), torch.zeros((), device=dev)
        with torch.no_grad(), autocast():
            for i in range(0, len(x_test), a.eval_batch):
                logits = step_model(x_test[i:i + a.eval_batch]).float()
                y = y_test[i:i + a.eval_batch]
                loss += F.cross_entropy(logits, y, reduction="sum")
                correct += (logits.argmax(1) == y).sum()
        model.train()
        return 100.0 * correct.item() / len(x_test), loss.item() / len(x_test)

    gen = torch.Generator().manual_seed(a.seed)
    warmup, total = float(r["warmup_epochs"]) * upe, float(epochs * upe)
    curve, k, train_s = [], 0, 0.0
    print(f"torch_fmnist_loop: {r['model']} on {dev.type}, {n} images, {epochs} epochs x {upe} "
          f"updates of {batch}, {a.precision}, attention {'sdpa' if sdpa else 'math'}, AdamW"
          f"{' fused' if fused else ''}{', compiled' if a.compile else ''}", file=sys.stderr)
    sync()
    t0 = time.perf_counter()
    setup_s = t0 - T_PROCESS
    for epoch in range(epochs):
        t_epoch = time.perf_counter()
        order = torch.randperm(n, generator=gen).to(dev)
        loss_sum = torch.zeros((), device=dev)
        for u in range(upe):
            cur = torch_vit.cosine_lr(k, lr, warmup_lr, min_lr, warmup, total)
            for g in opt.param_groups:
                g["lr"] = cur
            idx = order[u * batch:(u + 1) * batch]
            x, y = x_train[idx], y_train[idx]
            if hflip > 0:
                flip = torch.rand(batch, device=dev) < hflip
                x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            with autocast():
                logits = step_model(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=smoothing)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
            k += 1
        sync()
        train_s += time.perf_counter() - t_epoch
        top1, eval_loss = evaluate()
        elapsed = time.perf_counter() - t0
        row = {"impl": "torch-loop", "epoch": epoch, "top1": round(top1, 4),
               "eval_loss": round(eval_loss, 6), "train_loss": round(loss_sum.item() / upe, 6),
               "lr": cur, "elapsed_s": round(elapsed, 3), "train_s": round(train_s, 3)}
        curve.append(row)
        print(json.dumps(row), flush=True)
        print(f"torch_fmnist_loop: epoch {epoch}: top-1 {top1:.2f}% at {elapsed:.1f} s",
              file=sys.stderr)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(json.dumps({
        "impl": "torch-loop", "final": True, "model": r["model"],
        "recipe": os.path.relpath(a.recipe, ROOT), "device": dev.type, "device_name": name,
        "precision": a.precision, "attention": "sdpa" if sdpa else "math",
        "optimizer": "AdamW fused" if fused else "AdamW", "compile": a.compile,
        "epochs": epochs, "batch": batch, "updates": k, "train_images": n,
        "test_images": len(x_test), "top1_final": curve[-1]["top1"],
        "top1_best": max(c["top1"] for c in curve), "loop_s": curve[-1]["elapsed_s"],
        "setup_s": round(setup_s, 3), "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
