"""PyTorch reference data for the C++ tests.

Writes into --out:
  ops.safetensors            every CPU op of src/ops/cpu/ops.h: forward outputs and the input /
                             parameter gradients for a random upstream gradient `dout`, on random
                             and hostile inputs (tests/test_ops_torch.cpp). Tensors are named
                             <case>.<tensor>; integer sizes are in <case>.dims (F32).
  golden_<ffn>_<cls>[_conv].safetensors  a tiny ViT per {mlp, local} x {token, avg}, mlp/avg
                             with the conv stem and mlp_tanh/token: weights under timm
                             keys, a batch, logits, loss, every parameter gradient, and the
                             losses, pre-clip grad norms and learning rates of 10 AdamW updates
                             on that batch (tests/test_golden.cpp); the config in __metadata__.
Inputs are stored as F32; every expected value is computed in float64 from those exact float32
values and stored as F64. Deterministic (fixed seeds).
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


# Always copy: .to() is a no-op for a tensor that already has the dtype, and .numpy() shares its
# memory, so a stored gradient would otherwise change with every later backward/optimizer step.
def f32(t):
    return t.detach().to(torch.float32).numpy().copy()


def f64(t):
    return t.detach().to(torch.float64).numpy().copy()


def dims(*v):
    return torch.tensor(v, dtype=torch.float32)


class Cases:
    def __init__(self):
        self.tensors = {}
        self.names = []

    def add(self, case, inputs, outputs):
        """inputs: tensors holding float32 values (stored F32); outputs: stored F64."""
        assert case not in self.names, case
        self.names.append(case)
        for k, v in inputs.items():
            self.tensors[f"{case}.{k}"] = f32(v)
        for k, v in outputs.items():
            self.tensors[f"{case}.{k}"] = f64(v)


def leaf(t):
    """A float64 leaf requiring grad, holding exactly the float32 values of t."""
    return t.to(torch.float32).to(torch.float64).requires_grad_(True)


def run(fn, inputs, grads_of, extra=None):
    """fn on float64 copies of the (float32-valued) inputs, then backward with a random
    float32-valued dout. Returns dout and {"out": ..., "d<name>": ...}; `extra(xs)` may add more
    float64 outputs computed from the leaves (saved statistics)."""
    xs = {k: leaf(v) for k, v in inputs.items()}
    out = fn(**xs)
    dout = torch.randn(out.shape, dtype=torch.float32)
    out.backward(dout.to(torch.float64))
    outputs = {"out": out}
    for k in grads_of:
        outputs["d" + k] = xs[k].grad
    if extra is not None:
        with torch.no_grad():
            outputs.update(extra(xs))
    return dout, outputs


def attention_ref(qkv, B, N, H, D):
    q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    att = (q @ k.transpose(-2, -1) * D ** -0.5).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, N, H * D), att


def op_cases():
    torch.manual_seed(1234)
    c = Cases()

    # matmul: out (M, N) = inp (M, K) @ w (N, K)^T + b, M = 2 * 197 rows.
    M, K, N = 394, 40, 24
    inp, w, b = torch.randn(M, K), torch.randn(N, K) * 0.2, torch.randn(N)
    dout, o = run(lambda inp, w, b: inp @ w.t() + b, {"inp": inp, "w": w, "b": b},
                  ["inp", "w", "b"])
    c.add("matmul", {"inp": inp, "w": w, "b": b, "dout": dout, "dims": dims(M, K, N)}, o)

    # LayerNorm (eps 1e-6), plain and hostile (row mean 1e3, std 1e-2); also the saved
    # statistics mean and rstd = 1 / sqrt(biased var + eps).
    for case, x in [("layernorm", torch.randn(394, 48) * 2 + 0.5),
                    ("layernorm_hostile", 1e3 + 1e-2 * torch.randn(16, 48))]:
        R, C = x.shape
        w, b = 1 + 0.1 * torch.randn(C), 0.1 * torch.randn(C)
        dout, o = run(lambda inp, w, b: F.layer_norm(inp, (C,), w, b, 1e-6),
                      {"inp": x, "w": w, "b": b}, ["inp", "w", "b"],
                      lambda xs: {"mean": xs["inp"].mean(-1),
                                  "rstd": (xs["inp"].var(-1, unbiased=False) + 1e-6).rsqrt()})
        c.add(case, {"inp": x, "w": w, "b": b, "dout": dout, "dims": dims(R, C)}, o)

    # Attention core on a (B, N, 3C) qkv buffer (q | k | v heads per token); att = softmax
    # probabilities (B, H, N, N).
    for case, (B, N, H, D) in [("attention", (2, 197, 3, 64)), ("attention_odd", (3, 17, 2, 24))]:
        qkv = torch.randn(B, N, 3 * H * D)
        dout, o = run(lambda qkv: attention_ref(qkv, B, N, H, D)[0], {"qkv": qkv}, ["qkv"],
                      lambda xs: {"att": attention_ref(xs["qkv"], B, N, H, D)[1]})
        c.add(case, {"qkv": qkv, "dout": dout, "dims": dims(B, N, H, D)}, o)

    # Elementwise activations: a dense sweep of [-8, 8] (offset so that no point sits exactly on
    # the h-swish kinks at +-3), tails out to +-30 and a few tiny values.
    x = torch.cat([torch.linspace(-8, 8, 2001) + 0.00317,
                   torch.tensor([-30.0, -12.5, -9.0, 9.0, 12.5, 30.0, 1e-6, -1e-6, 1e-3, -1e-3])])
    dout, o = run(lambda inp: F.gelu(inp), {"inp": x}, ["inp"])
    c.add("gelu", {"inp": x, "dout": dout}, o)
    dout, o = run(lambda inp: torch_vit.hswish(inp), {"inp": x}, ["inp"])
    c.add("hswish", {"inp": x, "dout": dout}, o)
    dout, o = run(lambda inp: F.gelu(inp, approximate="tanh"), {"inp": x}, ["inp"])
    c.add("gelu_tanh", {"inp": x, "dout": dout}, o)

    # Depthwise 3x3 (padding 1, no bias) on the token grid, with and without a class token;
    # prefix rows of the output (and of dinp) are zero.
    for case, (B, prefix, gh, gw, C) in [("dwconv", (2, 1, 14, 14, 37)),
                                          ("dwconv_rect", (2, 0, 3, 5, 8))]:
        x, w = torch.randn(B, prefix + gh * gw, C), 0.3 * torch.randn(C, 1, 3, 3)

        def dw(inp, w):
            g = inp[:, prefix:].reshape(B, gh, gw, C).permute(0, 3, 1, 2)
            y = F.conv2d(g, w, padding=1, groups=C).permute(0, 2, 3, 1).reshape(B, gh * gw, C)
            return torch.cat([torch.zeros_like(inp[:, :prefix]), y], dim=1)

        dout, o = run(dw, {"inp": x, "w": w}, ["inp", "w"])
        c.add(case, {"inp": x, "w": w, "dout": dout,
                     "dims": dims(B, prefix + gh * gw, prefix, gh, gw, C)}, o)

    # Patch extraction = the unfold that makes a stride-P conv a GEMM: (B, L, Cin*P*P) with the
    # (c, ph, pw) order of Conv2d's weight; checked against conv2d itself as well.
    B, Cin, S, P = 2, 3, 32, 4
    img = torch.randn(B, Cin, S, S)
    patches = F.unfold(img.double(), P, stride=P).transpose(1, 2)
    wconv = torch.randn(5, Cin, P, P, dtype=torch.float64)
    conv = F.conv2d(img.double(), wconv, stride=P).flatten(2).transpose(1, 2)
    assert torch.allclose(patches @ wconv.reshape(5, -1).t(), conv, atol=1e-12)
    c.add("im2patches", {"img": img, "dims": dims(B, Cin, S, S, P)}, {"out": patches})

    conv_stem_op_cases(c)

    # Token assembly: x = [cls | patch_out] + pos, and the avg-classifier variant without cls.
    for case, prefix in [("embed", 1), ("embed_nocls", 0)]:
        B, NP, C = 2, 16, 8
        patch, cls, pos = torch.randn(B, NP, C), torch.randn(C), torch.randn(NP + prefix, C)
        if prefix:
            fn = lambda patch, cls, pos: torch.cat(  # noqa: E731
                [cls.reshape(1, 1, C).expand(B, 1, C), patch], dim=1) + pos
            inputs, grads = {"patch": patch, "cls": cls, "pos": pos}, ["patch", "cls", "pos"]
        else:
            fn = lambda patch, pos: patch + pos  # noqa: E731
            inputs, grads = {"patch": patch, "pos": pos}, ["patch", "pos"]
        dout, o = run(fn, inputs, grads)
        c.add(case, dict(inputs, dout=dout, dims=dims(B, NP + prefix, prefix, C)), o)

    # Residual: out = x + scale[b] * gamma[c] * branch (layer scale + stochastic-depth scale,
    # one sample dropped), and the plain x + branch.
    B, S, C = 2, 5, 8
    x, br, g = torch.randn(B, S, C), torch.randn(B, S, C), torch.randn(C)
    s = torch.tensor([0.0, 1.25])
    dout, o = run(lambda x, br, g: x + s.double().reshape(B, 1, 1) * g * br,
                  {"x": x, "br": br, "g": g}, ["br", "g"])
    c.add("residual", {"x": x, "br": br, "g": g, "scale": s, "dout": dout, "dims": dims(B, S, C)},
          o)
    x, br = torch.randn(B, S, C), torch.randn(B, S, C)
    dout, o = run(lambda x, br: x + br, {"x": x, "br": br}, ["br"])
    c.add("residual_plain", {"x": x, "br": br, "dout": dout, "dims": dims(B, S, C)}, o)

    # Pooling: the class token; the mean of the patch tokens behind a class token; the mean of
    # all tokens (avg classifier, no class token).
    for case, (B, N, prefix, C, avg) in [("pool_token", (2, 17, 1, 8, 0)),
                                          ("pool_avg", (2, 17, 1, 8, 1)),
                                          ("pool_avg_nocls", (3, 16, 0, 8, 1))]:
        x = torch.randn(B, N, C)
        fn = (lambda x: x[:, prefix:].mean(dim=1)) if avg else (lambda x: x[:, 0])
        dout, o = run(fn, {"x": x}, ["x"])
        c.add(case, {"x": x, "dout": dout, "dims": dims(B, N, prefix, C, avg)}, o)

    # Soft-target cross-entropy: per-sample losses, probs, and d(mean loss)/dlogits; targets
    # one-hot smoothed by 0.1 plus a mixup-like row; plain logits and logits near +-80.
    for case, z in [("cross_entropy", torch.randn(6, 10) * 3),
                    ("cross_entropy_hostile", torch.sign(torch.randn(6, 10)) * 80
                     + torch.randn(6, 10))]:
        B, K = z.shape
        t = torch.full((B, K), 0.1 / K)
        t[torch.arange(B), torch.randint(0, K, (B,))] += 0.9
        t[B - 1] = torch.softmax(torch.randn(K), 0)  # a mixup-like row
        zz = leaf(z)
        per = (-t.double() * F.log_softmax(zz, -1)).sum(-1)
        per.mean().backward()
        c.add(case, {"logits": z, "targets": t, "dims": dims(B, K)},
              {"losses": per, "probs": zz.detach().softmax(-1), "dlogits": zz.grad})
    return c


def conv_stem_op_cases(c):
    """The conv stem's ops: im2col of a 3x3 stride-2 padding-1 conv (= F.unfold), the conv
    itself as im2col + GEMM forward and col2im + GEMM backward (= F.conv2d on the channels-last
    input permuted to NCHW), ReLU, and the whole stem (torch_vit.ConvStem)."""
    # im2col: channels-last and NCHW inputs, odd and even sides; rows (B, Ho, Wo, C*9).
    for case, (B, H, W, C) in [("im2col", (2, 8, 6, 3)), ("im2col_odd", (1, 7, 5, 4))]:
        x = torch.randn(B, H, W, C)
        cols = F.unfold(x.permute(0, 3, 1, 2).double(), 3, padding=1, stride=2).transpose(1, 2)
        c.add(case, {"inp": x, "inp_nchw": x.permute(0, 3, 1, 2).contiguous(),
                     "dims": dims(B, H, W, C)}, {"out": cols})

    # conv 3x3 stride 2 on a channels-last input (a deeper stem layer) and on an NCHW image (the
    # first layer: no input gradient). out (B, Ho, Wo, Co), w (Co, Ci, 3, 3).
    for case, (B, H, W, Ci, Co) in [("conv3x3s2", (2, 14, 14, 12, 20)),
                                     ("conv3x3s2_odd", (2, 7, 9, 5, 8))]:
        x, w = torch.randn(B, H, W, Ci), torch.randn(Co, Ci, 3, 3) / (3 * Ci ** 0.5)
        dout, o = run(lambda inp, w: F.conv2d(inp.permute(0, 3, 1, 2), w, stride=2, padding=1)
                      .permute(0, 2, 3, 1), {"inp": x, "w": w}, ["inp", "w"])
        c.add(case, {"inp": x, "w": w, "dout": dout, "dims": dims(B, H, W, Ci, Co)}, o)
    B, Ci, S, Co = 2, 3, 16, 8
    img, w = torch.randn(B, Ci, S, S), torch.randn(Co, Ci, 3, 3) / 5
    dout, o = run(lambda img, w: F.conv2d(img, w, stride=2, padding=1).permute(0, 2, 3, 1),
                  {"img": img, "w": w}, ["w"])
    c.add("conv3x3s2_nchw", {"img": img, "w": w, "dout": dout, "dims": dims(B, S, S, Ci, Co)}, o)

    # ReLU, with exact zeros (gradient 0 there, as PyTorch's).
    x = torch.cat([torch.randn(500), torch.zeros(4), torch.tensor([-0.0, 1e-30, -1e-30])])
    dout, o = run(lambda inp: F.relu(inp), {"inp": x}, ["inp"])
    c.add("relu", {"inp": x, "dout": dout}, o)

    # The whole stem: image (B, Cin, S, S) -> tokens (B, (S/P)^2, C); P = 8 gives three 3x3
    # layers (widths 16, 16, 24 for C = 24) and an odd final grid side (S 24 -> 3).
    B, Cin, S, P, C = 2, 3, 24, 8, 24
    stem = torch_vit.ConvStem(Cin, C, P)
    with torch.no_grad():
        for name, p in stem.named_parameters():
            if "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    weights = {k: v.detach().clone() for k, v in stem.state_dict().items()}
    stem = stem.double()
    img = torch.randn(B, Cin, S, S)
    out = stem(img.double())
    dout = torch.randn(out.shape, dtype=torch.float32)
    out.backward(dout.double())
    inputs = {"img": img, "dout": dout, "dims": dims(B, Cin, S, P, C)}
    inputs.update({"w.patch_embed." + k: v for k, v in weights.items()})
    outputs = {"out": out}
    outputs.update({"d.patch_embed." + k: p.grad for k, p in stem.named_parameters()})
    c.add("conv_stem", inputs, outputs)


CONFIGS = [("mlp", "token", 0.0, "patch"), ("mlp", "avg", 0.0, "patch"),
           ("local", "token", 0.0, "patch"), ("local", "avg", 0.1, "patch"),
           ("mlp", "avg", 0.0, "conv"), ("mlp_tanh", "token", 0.0, "patch")]
LR = dict(base=2e-3, warmup_lr=1e-4, min_lr=1e-5, warmup=3, total=10)
WD, CLIP, STEPS, BATCH = 0.05, 1.0, 10, 6


def golden(ffn, cls, layer_scale, stem, out_dir):
    torch.manual_seed({"mlp": 1, "local": 2, "mlp_tanh": 3}[ffn] * 10 +
                      {"token": 1, "avg": 2}[cls] + {"patch": 0, "conv": 5}[stem])
    cfg = dict(img_size=16, patch_size=4, in_chans=3, embed_dim=32, depth=2, num_heads=4,
               mlp_ratio=4.0, num_classes=5, classifier=cls, ffn=ffn, qkv_bias=True,
               layer_scale_init=layer_scale, stem=stem)
    model = torch_vit.ViT(**cfg)
    # Non-trivial float32 weights so that every gradient matters: LayerNorm weights 1 + 0.1 N,
    # layer scales init + 0.02 N, biases / pos_embed / cls_token / patch-embed weight 0.1 N,
    # other matrices N / sqrt(fan_in).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("gamma"):
                p.copy_(layer_scale + 0.02 * torch.randn_like(p))
            elif p.ndim <= 1 or "embed" in name or "token" in name:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    params = {k: f32(v) for k, v in model.state_dict().items()}
    model = model.double()  # exact: the float32 values widen losslessly
    B, K = BATCH, cfg["num_classes"]
    images = torch.randn(B, cfg["in_chans"], cfg["img_size"], cfg["img_size"])
    targets = torch.full((B, K), 0.1 / K)
    targets[torch.arange(B), torch.arange(B) % K] += 0.9
    targets[B - 1] = 0.6 * targets[0] + 0.4 * targets[1]  # a mixup row
    x, t = images.double(), targets.double()

    logits = model(x)
    loss = torch_vit.soft_cross_entropy(logits, t)
    loss.backward()
    tensors = dict(params)
    tensors["input.images"] = f32(images)
    tensors["input.targets"] = f32(targets)
    tensors["expected.logits"] = f64(logits)
    tensors["expected.loss"] = np.array([loss.item()], dtype=np.float64)
    for name, p in model.named_parameters():
        tensors["grad." + name] = f64(p.grad)
    # Every gradient is non-trivial (catches a forgotten path on either side), except the last
    # block's locality FFN under the token classifier: it only touches patch tokens, which no
    # longer reach the class token, so its gradient is exactly zero on both sides.
    last = f"blocks.{cfg['depth'] - 1}."
    for name, p in model.named_parameters():
        dead = ffn == "local" and cls == "token" and (name.startswith(last + "mlp.") or
                                                      name.startswith(last + "norm2.") or
                                                      name.startswith(last + "ls2."))
        assert (p.grad.abs().max() == 0) if dead else (p.grad.abs().max() > 1e-5), \
            (ffn, cls, name, p.grad.abs().max().item())

    opt = torch.optim.AdamW(torch_vit.decay_groups(model, WD), lr=LR["base"], betas=(0.9, 0.999),
                            eps=1e-8)
    losses, norms, lrs = [], [], []
    for k in range(STEPS):
        lr = torch_vit.cosine_lr(k, LR["base"], LR["warmup_lr"], LR["min_lr"], LR["warmup"],
                                 LR["total"])
        lrs.append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = torch_vit.soft_cross_entropy(model(x), t)
        losses.append(loss.item())
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        opt.step()
    tensors["expected.step_losses"] = np.array(losses, dtype=np.float64)
    tensors["expected.step_grad_norms"] = np.array(norms, dtype=np.float64)
    tensors["expected.step_lrs"] = np.array(lrs, dtype=np.float64)
    meta = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in cfg.items()}
    meta.update({"lr_" + k: str(v) for k, v in LR.items()})
    meta.update({"weight_decay": str(WD), "clip_grad": str(CLIP), "betas": "0.9,0.999",
                 "adam_eps": "1e-08", "steps": str(STEPS),
                 "layer_scale": "true" if layer_scale > 0 else "false"})
    suffix = "" if stem == "patch" else "_" + stem
    torch_vit.write_safetensors(os.path.join(out_dir, f"golden_{ffn}_{cls}{suffix}.safetensors"),
                                tensors, meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    c = op_cases()
    torch_vit.write_safetensors(os.path.join(args.out, "ops.safetensors"), c.tensors,
                                {"cases": ",".join(c.names)})
    for ffn, cls, ls, stem in CONFIGS:
        golden(ffn, cls, ls, stem, args.out)


if __name__ == "__main__":
    main()
