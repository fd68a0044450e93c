"""PyTorch reference data for the C++ tests.

Writes into --out:
  ops.safetensors            every CPU op's forward outputs and input/parameter gradients for a
                             random upstream gradient, on random and hostile inputs
                             (tests/test_ops_torch.cpp)
  golden_<ffn>_<cls>.safetensors  a tiny ViT per {mlp, local} x {token, avg}: weights under timm
                             keys, a batch, logits, loss, every parameter gradient, and the losses
                             of 10 AdamW updates (tests/test_golden.cpp)
Inputs are float32; every expected value is computed in float64 from those exact inputs.
Run with Debian's interpreter: /usr/bin/python3 torch_ref.py --out DIR
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_vit  # noqa: E402

torch.set_num_threads(2)


def f32(t):
    return t.detach().to(torch.float32).numpy()


def f64(t):
    return t.detach().to(torch.float64).numpy()


class Cases:
    def __init__(self):
        self.tensors = {}
        self.names = []

    def add(self, case, inputs, outputs):
        """inputs: float32-valued tensors; outputs: float64 tensors."""
        self.names.append(case)
        for k, v in inputs.items():
            self.tensors[f"{case}.{k}"] = f32(v)
        for k, v in outputs.items():
            self.tensors[f"{case}.{k}"] = f64(v)


def leaf(t):
    """A float64 leaf requiring grad, holding exactly the float32 values of t."""
    return t.to(torch.float32).to(torch.float64).requires_grad_(True)


def run(fn, inputs, grads_of):
    """Forward fn on float64 copies of inputs, backward with a random dout."""
    xs = {k: leaf(v) for k, v in inputs.items()}
    out = fn(**xs)
    dout = torch.randn(out.shape, dtype=torch.float32)
    out.backward(dout.to(torch.float64))
    outputs = {"out": out}
    for k in grads_of:
        outputs["d" + k] = xs[k].grad
    return out, dout, outputs


def op_cases():
    torch.manual_seed(1234)
    c = Cases()

    # matmul: out = inp @ w^T + b; M = 2 * 197 rows.
    inp, w, b = torch.randn(394, 40), torch.randn(24, 40) * 0.2, torch.randn(24)
    _, dout, o = run(lambda inp, w, b: inp @ w.t() + b, {"inp": inp, "w": w, "b": b},
                     ["inp", "w", "b"])
    c.add("matmul", {"inp": inp, "w": w, "b": b, "dout": dout}, o)

    # LayerNorm, plain and hostile (row mean 1e3, std 1e-2).
    for case, x in [("layernorm", torch.randn(394, 48) * 2 + 0.5),
                    ("layernorm_hostile", 1e3 + 1e-2 * torch.randn(16, 48))]:
        w, b = 1 + 0.1 * torch.randn(48), 0.1 * torch.randn(48)
        _, dout, o = run(lambda inp, w, b: F.layer_norm(inp, (48,), w, b, 1e-6),
                         {"inp": x, "w": w, "b": b}, ["inp", "w", "b"])
        c.add(case, {"inp": x, "w": w, "b": b, "dout": dout}, o)

    # Attention core on a (B, N, 3C) qkv buffer.
    for case, (B, N, H, D) in [("attention", (2, 197, 3, 64)), ("attention_odd", (3, 17, 2, 24))]:
        C = H * D
        qkv = torch.randn(B, N, 3 * C)

        def attn(qkv):
            q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-2, -1) * D ** -0.5).softmax(-1)
            return (a @ v).transpose(1, 2).reshape(B, N, C)

        _, dout, o = run(attn, {"qkv": qkv}, ["qkv"])
        c.add(case, {"qkv": qkv, "dout": dout,
                     "dims": torch.tensor([B, N, H, D], dtype=torch.float32)}, o)

    # Elementwise activations over [-6, 6] (h-swish kinks at +-3 avoided by the random draw).
    x = torch.linspace(-6, 6, 1001) + 0.00317
    _, dout, o = run(lambda inp: F.gelu(inp), {"inp": x}, ["inp"])
    c.add("gelu", {"inp": x, "dout": dout}, o)
    _, dout, o = run(lambda inp: torch_vit.hswish(inp), {"inp": x}, ["inp"])
    c.add("hswish", {"inp": x, "dout": dout}, o)

    # Depthwise 3x3 on the token grid, with and without a class token.
    for case, (B, prefix, gh, gw, C) in [("dwconv", (2, 1, 14, 14, 37)),
                                          ("dwconv_rect", (2, 0, 3, 5, 8))]:
        x, w = torch.randn(B, prefix + gh * gw, C), 0.3 * torch.randn(C, 1, 3, 3)

        def dw(inp, w):
            g = inp[:, prefix:].reshape(B, gh, gw, C).permute(0, 3, 1, 2)
            y = F.conv2d(g, w, padding=1, groups=C).permute(0, 2, 3, 1).reshape(B, gh * gw, C)
            return torch.cat([torch.zeros_like(inp[:, :prefix]), y], dim=1)

        _, dout, o = run(dw, {"inp": x, "w": w}, ["inp", "w"])
        c.add(case, {"inp": x, "w": w, "dout": dout,
                     "dims": torch.tensor([B, prefix, gh, gw, C], dtype=torch.float32)}, o)

    # Patch extraction = unfold of a stride-P conv.
    img = torch.randn(2, 3, 32, 32)
    c.add("im2patches", {"img": img},
          {"out": F.unfold(img.double(), 4, stride=4).transpose(1, 2)})

    # Token assembly: [cls | patches] + pos.
    patch, cls, pos = torch.randn(2, 16, 8), torch.randn(8), torch.randn(17, 8)
    _, dout, o = run(lambda patch, cls, pos: torch.cat(
        [cls.reshape(1, 1, 8).expand(2, 1, 8), patch], dim=1) + pos,
        {"patch": patch, "cls": cls, "pos": pos}, ["patch", "cls", "pos"])
    c.add("embed", {"patch": patch, "cls": cls, "pos": pos, "dout": dout}, o)

    # Residual with layer scale and a per-sample stochastic-depth scale.
    x, br, g = torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(8)
    s = torch.tensor([0.0, 1.25])
    _, dout, o = run(lambda x, br, g: x + s.double().reshape(2, 1, 1) * g * br,
                     {"x": x, "br": br, "g": g}, ["br", "g"])
    c.add("residual", {"x": x, "br": br, "g": g, "scale": s, "dout": dout}, o)

    # Pooling: class token, or mean of the patch tokens.
    x = torch.randn(2, 17, 8)
    _, dout, o = run(lambda x: x[:, 0], {"x": x}, ["x"])
    c.add("pool_token", {"x": x, "dout": dout}, o)
    _, dout, o = run(lambda x: x[:, 1:].mean(dim=1), {"x": x}, ["x"])
    c.add("pool_avg", {"x": x, "dout": dout}, o)

    # Soft-target cross-entropy (mean over the batch), plain and with logits near +-80.
    for case, z in [("cross_entropy", torch.randn(6, 10) * 3),
                    ("cross_entropy_hostile", torch.sign(torch.randn(6, 10)) * 80
                     + torch.randn(6, 10))]:
        t = torch.full((6, 10), 0.1 / 9)
        t[torch.arange(6), torch.randint(0, 10, (6,))] = 0.9
        t[5] = torch.softmax(torch.randn(10), 0)  # a mixup-like row
        zz = leaf(z)
        per = (-t.double() * F.log_softmax(zz, -1)).sum(-1)
        per.mean().backward()
        c.add(case, {"logits": z, "targets": t}, {"losses": per, "dlogits": zz.grad})
    return c


CONFIGS = [("mlp", "token", 0.0), ("mlp", "avg", 0.0), ("local", "token", 0.0),
           ("local", "avg", 0.1)]
LR = dict(base=2e-3, warmup_lr=1e-4, min_lr=1e-5, warmup=3, total=10)
WD, CLIP, STEPS = 0.05, 1.0, 10


def golden(ffn, cls, layer_scale, out_dir):
    torch.manual_seed({"mlp": 1, "local": 2}[ffn] * 10 + {"token": 1, "avg": 2}[cls])
    cfg = dict(img_size=16, patch_size=4, in_chans=3, embed_dim=32, depth=2, num_heads=4,
               mlp_ratio=4.0, num_classes=5, classifier=cls, ffn=ffn, qkv_bias=True,
               layer_scale_init=layer_scale)
    model = torch_vit.ViT(**cfg)
    with torch.no_grad():  # non-trivial float32 weights, so every gradient matters
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or \
                    name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("gamma"):
                p.copy_(layer_scale + 0.02 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p) if p.ndim <= 1 or "embed" in name or
                        "token" in name else torch.randn_like(p) / p[0].numel() ** 0.5)
    params = {k: v.detach().clone().to(torch.float32) for k, v in model.state_dict().items()}
    model = model.double()
    B = 6
    images = torch.randn(B, 3, 16, 16)
    targets = torch.full((B, 5), 0.1 / 5)
    targets[torch.arange(B), torch.arange(B) % 5] += 0.9
    targets[B - 1] = 0.6 * targets[0] + 0.4 * targets[1]  # a mixup row
    x, t = images.double(), targets.double()

    logits = model(x)
    loss = torch_vit.soft_cross_entropy(logits, t)
    loss.backward()
    tensors = {k: v.numpy() for k, v in params.items()}
    tensors["input.images"] = f32(images)
    tensors["input.targets"] = f32(targets)
    tensors["expected.logits"] = f64(logits)
    tensors["expected.loss"] = np.array([loss.item()], dtype=np.float64)
    for name, p in model.named_parameters():
        tensors["grad." + name] = f64(p.grad)

    model.zero_grad()
    opt = torch.optim.AdamW(torch_vit.decay_groups(model, WD), lr=LR["base"], betas=(0.9, 0.999),
                            eps=1e-8)
    losses = []
    for k in range(STEPS):
        lr = torch_vit.cosine_lr(k, LR["base"], LR["warmup_lr"], LR["min_lr"], LR["warmup"],
                                 LR["total"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = torch_vit.soft_cross_entropy(model(x), t)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    tensors["expected.step_losses"] = np.array(losses, dtype=np.float64)
    meta = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in cfg.items()}
    meta.update({"lr_" + k: str(v) for k, v in LR.items()})
    meta.update({"weight_decay": str(WD), "clip_grad": str(CLIP), "format": "pt"})
    torch_vit.write_safetensors(os.path.join(out_dir, f"golden_{ffn}_{cls}.safetensors"),
                                tensors, meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    c = op_cases()
    torch_vit.write_safetensors(os.path.join(args.out, "ops.safetensors"), c.tensors,
                                {"format": "pt", "cases": ",".join(c.names)})
    for ffn, cls, ls in CONFIGS:
        golden(ffn, cls, ls, args.out)


if __name__ == "__main__":
    main()
