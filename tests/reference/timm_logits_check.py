"""Checks that an exported vitrain model gives, outside vitrain, the logits `vitrain eval` wrote.

  vitrain export --checkpoint RUN/last.safetensors --out EXPORT
  vitrain eval --checkpoint RUN/last.safetensors --data-dir DATA --save-logits vitrain.npy
  python3 tests/reference/timm_logits_check.py --export EXPORT --logits vitrain.npy \
      --data-dir DATA --precision bf16

Loads EXPORT with timm (timm.create_model('local-dir:EXPORT', pretrained=True), strict key and
shape match), runs the data set's evaluation images in file order with vitrain's evaluation
preprocessing (pixels / 255, then (x - mean) / std with the mean and std of EXPORT/config.json;
no resize: the export's input size must be the images' size), in float32 (TF32 off), and
compares with the .npy: max abs difference (absolute and as a fraction of max |logit|), relative
L2 error, top-1 agreement, and both top-1 accuracies against the labels.

timm has no locality FFN and no conv stem: for config.json's architectures
"vitrain_vit_local_ffn" and "vitrain_vit_conv_stem" (the default recipe's vit_fmnist_hybrid has
both; model_args "ffn" and "stem" say which parts, older exports only the architecture) the
reference is tests/reference/torch_vit.py, the PyTorch module the C++ engine is checked against,
loaded from the same model.safetensors; the JSON says which ("loader"). --allow-reference uses it for timm architectures too where timm is missing (smoke
tests here; not a timm check).

Tolerances by --precision of the vitrain logits (set without a GPU run yet): fp32 (CPU or CUDA
fp32 eval): relative L2 <= 1e-4, max abs <= 1e-3 x max |logit|, top-1 agreement >= 99.9%; bf16
(CUDA bf16 eval): 3e-2, 0.1 x max |logit|, 98% (bf16 noise flips near-ties). Each can be
overridden. Data: IDX files (MNIST, Fashion-MNIST), *.gz or not.

Prints one JSON line; --json-out writes it to a file too. Exit status: 0 pass, 1 fail, 2 missing
input or dependency.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCES = {  # precision of the vitrain logits -> (relative L2, max abs / max |ref|, top-1 agreement)
    "fp32": (1e-4, 1e-3, 0.999),
    "bf16": (3e-2, 1e-1, 0.98),
}


def fail(msg, code=2):
    print(f"timm_logits_check: {msg}", file=sys.stderr)
    print(json.dumps({"pass": False, "error": msg}))
    sys.exit(code)


def open_maybe_gz(path):
    for p in (path, path + ".gz"):
        if os.path.isfile(p):
            return gzip.open(p, "rb") if p.endswith(".gz") else open(p, "rb")
    fail(f"{path}[.gz] not found")


def read_idx(path):
    """IDX: big-endian magic (0, 0, dtype 0x08 = uint8, ndim), ndim big-endian int32 sizes."""
    with open_maybe_gz(path) as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        fail(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        fail(f"{path}: {arr.size} bytes of data for dims {dims}")
    return arr.reshape(dims)


SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
                      "I32": np.int32, "U8": np.uint8}


def read_safetensors(path):
    """A minimal reader (8-byte little-endian header length, JSON header, raw data), so the
    reference path needs neither the safetensors package nor a new torch."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in SAFETENSORS_DTYPES:
            fail(f"{path}: tensor {name} has dtype {t['dtype']}, which this reader lacks")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=SAFETENSORS_DTYPES[t["dtype"]]).reshape(
            t["shape"])
    return out


def reference_model(export, cfg, torch):
    """tests/reference/torch_vit.py's ViT with the export's architecture and weights."""
    sys.path.insert(0, HERE)
    import torch_vit
    ma = cfg["model_args"]
    arch = cfg["architecture"]
    ffn = ma.get("ffn") or ("local" if arch == "vitrain_vit_local_ffn" else
                            "mlp_tanh" if ma.get("act_layer") == "gelu_tanh" else "mlp")
    stem = ma.get("stem") or ("conv" if arch == "vitrain_vit_conv_stem" else "patch")
    model = torch_vit.ViT(img_size=ma["img_size"], patch_size=ma["patch_size"],
                          in_chans=ma["in_chans"], embed_dim=ma["embed_dim"], depth=ma["depth"],
                          num_heads=ma["num_heads"], mlp_ratio=ma["mlp_ratio"],
                          num_classes=cfg["num_classes"],
                          classifier="token" if ma.get("class_token", True) else "avg",
                          ffn=ffn, stem=stem, qkv_bias=ma.get("qkv_bias", True),
                          layer_scale_init=ma.get("init_values") or 0.0)
    sd = {k: torch.from_numpy(v.copy()) for k, v in
          read_safetensors(os.path.join(export, "model.safetensors")).items()}
    model.load_state_dict(sd, strict=True)  # every key and shape, both ways
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True, help="folder written by vitrain export")
    ap.add_argument("--logits", required=True, help=".npy written by vitrain eval --save-logits")
    ap.add_argument("--data-dir", required=True, help="IDX data folder (Fashion-MNIST)")
    ap.add_argument("--split", choices=["val", "train"], default="val",
                    help="val = the t10k files (vitrain eval's default)")
    ap.add_argument("--precision", choices=sorted(TOLERANCES), default="bf16",
                    help="precision the vitrain logits were computed in (picks tolerances)")
    ap.add_argument("--rtol", type=float, help="max relative L2 error")
    ap.add_argument("--max-abs-frac", type=float, help="max |diff| / max |reference logit|")
    ap.add_argument("--min-agree", type=float, help="min top-1 agreement (fraction)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=0, help="only the first N images (0 = all)")
    ap.add_argument("--allow-reference", action="store_true",
                    help="without timm, check timm architectures against torch_vit.py instead")
    ap.add_argument("--json-out", help="also write the JSON result here")
    a = ap.parse_args()

    import torch
    cfg_path = os.path.join(a.export, "config.json")
    if not os.path.isfile(cfg_path) or not os.path.isfile(os.path.join(a.export,
                                                                       "model.safetensors")):
        fail(f"{a.export}: no config.json + model.safetensors (run vitrain export)")
    with open(cfg_path) as f:
        cfg = json.load(f)
    pc = cfg["pretrained_cfg"]
    chans, size_h, size_w = pc["input_size"]
    mean = np.asarray(pc["mean"], dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(pc["std"], dtype=np.float32).reshape(1, -1, 1, 1)

    if cfg["architecture"] in ("vitrain_vit_local_ffn", "vitrain_vit_conv_stem"):
        loader = "tests/reference/torch_vit.py (timm has no locality FFN or conv stem)"
        model = reference_model(a.export, cfg, torch)
    else:
        try:
            import timm
        except ImportError:
            timm = None
        if timm is not None:
            loader = f"timm {timm.__version__} local-dir:"
            model = timm.create_model("local-dir:" + os.path.abspath(a.export), pretrained=True)
        elif a.allow_reference:
            loader = "tests/reference/torch_vit.py (timm not installed: NOT a timm check)"
            model = reference_model(a.export, cfg, torch)
        else:
            fail("timm is not installed (--allow-reference checks against torch_vit.py instead)")

    stem = "t10k" if a.split == "val" else "train"
    images = read_idx(os.path.join(a.data_dir, f"{stem}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(a.data_dir, f"{stem}-labels-idx1-ubyte")).astype(np.int64)
    if images.ndim == 3:
        images = images[:, None]  # (N, 1, H, W): IDX images are grey
    if images.shape[1:] != (chans, size_h, size_w):
        fail(f"images are {images.shape[1:]}, the export expects {(chans, size_h, size_w)}: "
             "vitrain eval would resize, which this check does not reproduce")
    vit_logits = np.load(a.logits).astype(np.float32)
    n = len(images) if a.limit <= 0 else min(a.limit, len(images))
    if vit_logits.ndim != 2 or vit_logits.shape[0] < n or vit_logits.shape[1] != cfg["num_classes"]:
        fail(f"{a.logits}: shape {vit_logits.shape}, expected ({len(images)}, "
             f"{cfg['num_classes']})")
    if a.limit <= 0 and vit_logits.shape[0] != n:
        fail(f"{a.logits} has {vit_logits.shape[0]} rows, the {a.split} split {n} images")
    vit_logits, labels = vit_logits[:n], labels[:n]

    dev = torch.device("cuda" if a.device == "cuda" or
                       (a.device == "auto" and torch.cuda.is_available()) else "cpu")
    if dev.type == "cuda":  # a float32 reference: no TF32 anywhere
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = model.to(dev).eval().float()
    ref = np.empty((n, cfg["num_classes"]), dtype=np.float32)
    with torch.no_grad():
        for i in range(0, n, a.batch):
            x = (images[i:i + a.batch].astype(np.float32) / 255.0 - mean) / std
            ref[i:i + a.batch] = model(torch.from_numpy(x).to(dev)).float().cpu().numpy()

    rtol, max_abs_frac, min_agree = TOLERANCES[a.precision]
    rtol = a.rtol if a.rtol is not None else rtol
    max_abs_frac = a.max_abs_frac if a.max_abs_frac is not None else max_abs_frac
    min_agree = a.min_agree if a.min_agree is not None else min_agree
    diff = vit_logits.astype(np.float64) - ref.astype(np.float64)
    finite = bool(np.isfinite(vit_logits).all() and np.isfinite(ref).all())
    max_ref = float(np.abs(ref).max())
    max_abs = float(np.abs(diff).max()) if finite else float("inf")
    rel = float(np.linalg.norm(diff) / max(np.linalg.norm(ref.astype(np.float64)), 1e-30)) \
        if finite else float("inf")
    agree = float((vit_logits.argmax(1) == ref.argmax(1)).mean())
    res = {
        "pass": bool(finite and rel <= rtol and max_abs <= max_abs_frac * max_ref and
                     agree >= min_agree),
        "loader": loader,
        "architecture": cfg["architecture"],
        "precision": a.precision,
        "device": dev.type,
        "n": n,
        "finite": finite,
        "max_abs_diff": max_abs,
        "max_abs_ref": max_ref,
        "max_abs_frac": max_abs / max_ref if max_ref > 0 else float("inf"),
        "rel_l2": rel,
        "top1_agree": agree,
        "top1_vitrain": float((vit_logits.argmax(1) == labels).mean()),
        "top1_reference": float((ref.argmax(1) == labels).mean()),
        "tolerance": {"rel_l2": rtol, "max_abs_frac": max_abs_frac, "top1_agree": min_agree},
        "torch": torch.__version__,
    }
    line = json.dumps(res)
    print(line)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(line + "\n")
    if not res["pass"]:
        print(f"timm_logits_check: FAIL (rel L2 {rel:.3g} vs {rtol:g}, max abs {max_abs:.3g} vs "
              f"{max_abs_frac * max_ref:.3g}, top-1 agreement {agree:.4f} vs {min_agree})",
              file=sys.stderr)
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
