"""The vitrain model in PyTorch: the reference the C++ engine is checked against.

Same semantics and state_dict keys as timm's VisionTransformer (pre-norm blocks, LayerNorm eps
1e-6, qkv rows [q | k | v], erf GELU), plus the two options timm lacks or names differently:
the `avg` classifier without a class token (timm: global_pool='avg', class_token=False), the
locality FFN (Linear -> h-swish -> depthwise 3x3 on the token grid -> h-swish -> Linear, patch
tokens only) and the conv stem (3x3 stride-2 convs, each with LayerNorm over channels and ReLU,
then a 1x1 conv; ConvStem). Runs with Debian's python3-torch (1.13).
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def hswish(x):
    return x * F.relu6(x + 3.0) / 6.0


class Attention(nn.Module):
    def __init__(self, dim, heads, qkv_bias):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) * D ** -0.5).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    """Linear-GELU-Linear; approximate="tanh" is vitrain's mlp_tanh (timm's gelu_tanh)."""

    def __init__(self, dim, hidden, approximate="none"):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.approximate = approximate

    def forward(self, x, grid, prefix):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class LocalFfn(nn.Module):
    """The locality FFN on patch tokens; the class token's FFN output is zero."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.fc2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, grid, prefix):
        B, N, C = x.shape
        p = x[:, prefix:]
        h = hswish(self.fc1(p))
        h = h.reshape(B, grid, grid, -1).permute(0, 3, 1, 2)
        h = hswish(self.dwconv(h))
        h = h.permute(0, 2, 3, 1).reshape(B, grid * grid, -1)
        y = self.fc2(h)
        return torch.cat([torch.zeros_like(x[:, :prefix]), y], dim=1)


class LayerScale(nn.Module):
    def __init__(self, dim, init):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x):
        return x * self.gamma


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio, qkv_bias, ffn, layer_scale):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, qkv_bias)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        if ffn == "local":
            self.mlp = LocalFfn(dim, hidden)
        else:
            self.mlp = Mlp(dim, hidden, "tanh" if ffn == "mlp_tanh" else "none")
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale > 0 else nn.Identity()

    def forward(self, x, grid, prefix):
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x), grid, prefix))


class PatchEmbed(nn.Module):
    def __init__(self, in_chans, dim, patch):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


def stem_widths(dim, patch):
    """Output channels of the conv stem's 3x3 convs (ModelConfig::stem_widths)."""
    k = patch.bit_length() - 1
    assert patch >= 2 and 1 << k == patch, patch
    return [max(dim >> (k - i), min(dim, 16)) for i in range(1, k + 1)]


class StemConv(nn.Module):
    """Conv2d 3x3 stride 2 padding 1 without bias, LayerNorm over the channels of each pixel
    (channels-last, eps 1e-6), ReLU. NCHW in and out, as PyTorch convs."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(cout, eps=1e-6)

    def forward(self, x):
        y = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return F.relu(y)


class ConvStem(nn.Module):
    """The hybrid conv stem: log2(patch) StemConv layers, then a 1x1 conv with bias to dim;
    tokens (B, h*w, dim) as PatchEmbed."""

    def __init__(self, in_chans, dim, patch):
        super().__init__()
        widths = stem_widths(dim, patch)
        self.stem = nn.ModuleList([StemConv(ci, co) for ci, co in
                                   zip([in_chans] + widths[:-1], widths)])
        self.proj = nn.Conv2d(widths[-1], dim, 1)

    def forward(self, x):
        for layer in self.stem:
            x = layer(x)
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(nn.Module):
    def __init__(self, img_size=16, patch_size=4, in_chans=3, embed_dim=32, depth=2, num_heads=4,
                 mlp_ratio=4.0, num_classes=5, classifier="token", ffn="mlp", qkv_bias=True,
                 layer_scale_init=0.0, stem="patch"):
        super().__init__()
        self.grid = img_size // patch_size
        self.prefix = 1 if classifier == "token" else 0
        self.classifier = classifier
        if self.prefix:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid ** 2 + self.prefix, embed_dim))
        self.patch_embed = (PatchEmbed(in_chans, embed_dim, patch_size) if stem == "patch" else
                            ConvStem(in_chans, embed_dim, patch_size))
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, mlp_ratio, qkv_bias, ffn,
                                           layer_scale_init) for _ in range(depth)])
        norm = nn.LayerNorm(embed_dim, eps=1e-6)
        if classifier == "token":
            self.norm = norm
        else:
            self.fc_norm = norm
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        if self.prefix:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x, self.grid, self.prefix)
        if self.classifier == "token":
            x = self.norm(x)[:, 0]
        else:
            x = self.fc_norm(x.mean(dim=1))
        return self.head(x)


def soft_cross_entropy(logits, targets):
    return (-targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def decay_groups(model, weight_decay):
    """timm's rule: no decay for ndim <= 1, biases, pos_embed and cls_token."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.ndim <= 1 or name.endswith(".bias") or name in ("pos_embed", "cls_token"):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def cosine_lr(k, base, warmup_lr, min_lr, warmup, total):
    """timm CosineLRScheduler stepped per update (t = update index)."""
    if k < warmup:
        return warmup_lr + k * (base - warmup_lr) / warmup
    if k >= total:
        return min_lr
    return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * k / total))


def forward_flops_per_image(img, patch, in_chans, dim, depth, mlp_ratio, classes, classifier,
                            ffn, stem="patch"):
    """Multiply-adds count 2; the same formula as ModelConfig::forward_flops_per_image."""
    g = img // patch
    n_p = g * g
    n = n_p + (1 if classifier == "token" else 0)
    m = int(dim * mlp_ratio)
    f = 2.0 * n_p * in_chans * patch * patch * dim
    if stem == "conv":  # 3x3 stride-2 convs (norms and ReLU not counted), then the 1x1
        f, side, cin = 0.0, img, in_chans
        for w in stem_widths(dim, patch):
            side //= 2
            f += 2.0 * side * side * 9 * cin * w
            cin = w
        f += 2.0 * n_p * cin * dim
    n_ffn = n_p if ffn == "local" else n  # the class token bypasses the locality FFN
    block = n * (2 * dim * 3 * dim + 2 * dim * dim) + n_ffn * (2 * dim * m + 2 * m * dim)
    block += 2 * (2 * n * n * dim)
    if ffn == "local":
        block += n_p * 2 * 9 * m
    return f + depth * block + 2 * dim * classes


_DTYPES = {np.float32: "F32", np.float64: "F64", np.float16: "F16", np.int64: "I64",
           np.int32: "I32", np.uint8: "U8"}


def write_safetensors(path, tensors, metadata=None):
    """A minimal safetensors writer: 8-byte little-endian header length, JSON header (dtype,
    shape, data_offsets into the data buffer; string-valued __metadata__ with "format": "pt"),
    padded with spaces to a multiple of 8, then the raw little-endian row-major tensor bytes in
    dict order. Written to a temporary file and renamed into place."""
    meta = {"format": "pt"}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    header = {"__metadata__": meta}
    offset, blobs = 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        dtype = _DTYPES[arr.dtype.type]
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        blobs.append(arr.tobytes())
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
