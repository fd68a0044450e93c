"""Issue 48's export check for the class-token classifier: timm's vit_small_patch16_224 loads a
ViT-S/16 that vitrain trained and exported, and its logits match `vitrain eval` on the same images.
(tests/reference/timm_logits_check.py checks the small IDX-sized models; a 224-pixel RGB model
needs RGB images of its size, which this script makes.)

  python3 bench/timm_load_check.py --vitrain BIN/vitrain --device cuda --work DIR

Steps, all in --work:
  1. data/{train,val}/c0,c1/*.png: --images seeded 224 x 224 RGB images (smooth colour fields
     plus noise), half in each class, written as PNG (lossless: vitrain decodes the very pixels
     this script keeps; train/ holds the same files);
  2. vitrain train --model vit_small_patch16_224 --gp token --num-classes 1000: one epoch of
     batch 4 (--images / 4 updates) from the seeded initialisation, for weights away from the
     init at little cost; its last.safetensors is the checkpoint;
  3. vitrain export of its last.safetensors;
  4. vitrain eval --crop-pct 1 --save-logits per --precisions (crop_pct 1 at the model's own
     size is no resize: vitrain's eval input is the PNG's pixels, normalised with the
     checkpoint's mean and std, which the export's config.json repeats);
  5. the reference: timm.create_model('vit_small_patch16_224', num_classes=1000,
     class_token=True, global_pool='token') with the export's model.safetensors
     (load_state_dict strict: every key and shape), and timm's own loader of the folder
     (create_model('local-dir:EXPORT', pretrained=True)) where this timm has it; in float32 with
     TF32 off, on the same pixels normalised with config.json's mean and std (a local-dir
     load that fails is reported in load_errors, not failed: older timm lacks it). Without timm,
     --allow-reference loads tests/reference/torch_vit.py's ViT instead (a smoke test of the
     rest, NOT a timm check: the JSON's loader says so).
Tolerances (tests/reference/timm_logits_check.py's, per vitrain precision): fp32: relative L2
<= 1e-4, max |diff| <= 1e-3 x max |logit|, top-1 agreement >= 0.999; bf16: 3e-2, 0.1 x max
|logit|, agreement >= 0.9 here (a head 4 updates from its init has near-tied classes among 1000,
which bf16's noise may reorder in one image of 16).

vitrain runs with LD_LIBRARY_PATH=$VIT_LD_LIBRARY_PATH when that is set (the device bundle's
libraries; PyTorch in this process never sees them). Prints one JSON line (pass, loaders,
per-loader-and-precision figures, versions); exit 0 pass, 1 a mismatch or a load failure, 2 a
missing input or dependency, or a vitrain command that failed.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
TOL = {"fp32": (1e-4, 1e-3, 0.999), "bf16": (3e-2, 1e-1, 0.9)}  # rel L2, max abs frac, agree
SIZE, CLASSES = 224, 1000


def fail(msg, code=2):
    print(f"timm_load_check: {msg}", file=sys.stderr)
    print(json.dumps({"check": "timm_load", "pass": False, "error": msg}))
    sys.exit(code)


def write_png(path, rgb):
    """8-bit RGB (H, W, 3) as a PNG: signature, IHDR, one zlib IDAT of filter-0 rows, IEND."""
    h, w, _ = rgb.shape

    def chunk(kind, data):
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def make_images(root, n, seed, np):
    """(n, 3, SIZE, SIZE) uint8 in vitrain's ImageFolder order (classes, then files, sorted)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        cls = f"c{i * 2 // n}"
        coarse = rng.uniform(0, 255, (8, 8, 3))
        smooth = np.kron(coarse, np.ones((SIZE // 8, SIZE // 8, 1)))
        img = np.clip(smooth + rng.normal(0, 24, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
        for split in ("train", "val"):
            d = os.path.join(root, split, cls)
            os.makedirs(d, exist_ok=True)
            write_png(os.path.join(d, f"img_{i:04d}.png"), img)
        out.append(img.transpose(2, 0, 1))
    return np.stack(out)


def vitrain(binary, args, log):
    env = dict(os.environ)
    if os.environ.get("VIT_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["VIT_LD_LIBRARY_PATH"]
    t = time.perf_counter()
    p = subprocess.run([binary] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    print(p.stdout, file=log, end="", flush=True)
    if p.returncode != 0:
        tail = [line for line in p.stdout.splitlines() if line.strip()][-1:] or ["no output"]
        fail(f"vitrain {args[0]} exited {p.returncode}: {tail[0][:200]}")
    return round(time.perf_counter() - t, 2)


def compare(vit, ref, precision, np):
    rtol, frac, agree_min = TOL[precision]
    diff = vit.astype(np.float64) - ref.astype(np.float64)
    finite = bool(np.isfinite(vit).all() and np.isfinite(ref).all())
    max_ref = float(np.abs(ref).max())
    max_abs = float(np.abs(diff).max()) if finite else float("inf")
    rel = float(np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-30)) if finite else float("inf")
    agree = float((vit.argmax(1) == ref.argmax(1)).mean())
    return {"precision": precision, "pass": finite and rel <= rtol and max_abs <= frac * max_ref
            and agree >= agree_min, "rel_l2": rel, "max_abs_diff": max_abs,
            "max_abs_frac": max_abs / max_ref if max_ref > 0 else float("inf"),
            "top1_agree": agree, "tolerance": {"rel_l2": rtol, "max_abs_frac": frac,
                                               "top1_agree": agree_min}}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vitrain", default=shutil.which("vitrain") or "vitrain")
    ap.add_argument("--work", required=True, help="scratch folder (data, run, export, logits)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="vitrain's device, and the reference's where torch sees a GPU")
    ap.add_argument("--precisions", default="",
                    help="vitrain eval precisions (default: fp32,bf16 on cuda, fp32 on the cpu)")
    ap.add_argument("--images", type=int, default=16, help="a multiple of 4")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--allow-reference", action="store_true",
                    help="without timm, load into tests/reference/torch_vit.py (not a timm check)")
    ap.add_argument("--json-out", help="also write the JSON line here")
    a = ap.parse_args()
    precisions = a.precisions.split(",") if a.precisions else (
        ["fp32", "bf16"] if a.device == "cuda" else ["fp32"])
    if any(p not in TOL for p in precisions) or (a.device == "cpu" and precisions != ["fp32"]):
        fail(f"--precisions {a.precisions}: fp32 and bf16 (cuda), fp32 (cpu)")
    if a.images < 4 or a.images % 4:
        fail("--images must be a positive multiple of 4 (the training batch)")
    import numpy as np
    import torch
    try:
        import timm
    except ImportError:
        timm = None
    if timm is None and not a.allow_reference:
        fail("timm is not installed (--allow-reference checks against torch_vit.py instead)")
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    sys.path.insert(0, HERE)  # a bundle keeps the reference scripts beside this one
    from timm_logits_check import read_safetensors

    os.makedirs(a.work, exist_ok=True)
    data, run, exp = (os.path.join(a.work, d) for d in ("data", "runs", "export"))
    shutil.rmtree(data, ignore_errors=True)
    images = make_images(data, a.images, a.seed, np)
    log = sys.stderr
    secs = {"train": vitrain(a.vitrain, [
        "train", "--model", "vit_small_patch16_224", "--gp", "token", "--num-classes",
        str(CLASSES), "--data-dir", data, "-b", "4", "--epochs", "1", "--seed", str(a.seed),
        "--device", a.device, "--output", run, "--experiment", "vit_s16_token"], log)}
    ckpt = os.path.join(run, "vit_s16_token", "last.safetensors")
    if not os.path.isfile(ckpt):
        fail(f"no {ckpt} after vitrain train")
    secs["export"] = vitrain(a.vitrain, ["export", "--checkpoint", ckpt, "--out", exp], log)
    logits = {}
    for p in precisions:
        path = os.path.join(a.work, f"logits_{p}.npy")
        secs["eval_" + p] = vitrain(a.vitrain, [
            "eval", "--checkpoint", ckpt, "--data-dir", data, "--crop-pct", "1", "-b", "8",
            "--device", a.device, "--precision", p, "--save-logits", path], log)
        logits[p] = np.load(path).astype(np.float32)
        if logits[p].shape != (a.images, CLASSES):
            fail(f"{path}: shape {logits[p].shape}, expected ({a.images}, {CLASSES})")

    cfg = json.load(open(os.path.join(exp, "config.json")))
    sd = {k: torch.from_numpy(v.copy())
          for k, v in read_safetensors(os.path.join(exp, "model.safetensors")).items()}
    models, errors = {}, {}
    if timm is not None:
        m = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=CLASSES,
                              class_token=True, global_pool="token")
        try:
            m.load_state_dict(sd, strict=True)
            models["timm vit_small_patch16_224"] = m
        except RuntimeError as e:
            errors["timm vit_small_patch16_224"] = str(e)[:300]
        try:
            models["timm local-dir"] = timm.create_model("local-dir:" + os.path.abspath(exp),
                                                         pretrained=True)
        except Exception as e:  # an older timm without local-dir: reported, not failed
            errors["timm local-dir"] = f"{type(e).__name__}: {str(e)[:200]}"
    else:
        import torch_vit
        m = torch_vit.ViT(img_size=SIZE, patch_size=16, in_chans=3, embed_dim=384, depth=12,
                          num_heads=6, num_classes=CLASSES, classifier="token")
        m.load_state_dict(sd, strict=True)
        models["tests/reference/torch_vit.py (timm not installed: NOT a timm check)"] = m

    dev = torch.device("cuda" if a.device == "cuda" and torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    pc = cfg["pretrained_cfg"]
    mean = np.asarray(pc["mean"], dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(pc["std"], dtype=np.float32).reshape(1, 3, 1, 1)
    x = torch.from_numpy((images.astype(np.float32) / 255.0 - mean) / std).to(dev)
    results = []
    for name, m in models.items():
        with torch.no_grad():
            ref = m.to(dev).eval().float()(x).float().cpu().numpy()
        results += [dict(compare(logits[p], ref, p, np), loader=name) for p in precisions]
    primary = "timm vit_small_patch16_224" if timm is not None else next(iter(models))
    # timm's own loader of the folder counts where it loaded (a timm without local-dir: the
    # JSON's load_errors says so); the explicit vit_small_patch16_224 must load.
    ok = primary in models and all(r["pass"] for r in results)
    res = {"check": "timm_load", "pass": bool(ok), "model": "vit_small_patch16_224",
           "classifier": "token", "export_architecture": cfg["architecture"],
           "export_global_pool": cfg.get("global_pool"), "images": a.images,
           "updates": a.images // 4, "device": dev.type, "loaders": list(models),
           "load_errors": errors, "results": results, "vitrain_seconds": secs,
           "torch": torch.__version__, "timm": timm.__version__ if timm else None}
    line = json.dumps(res)
    print(line)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(line + "\n")
    for r in results:
        print(f"timm_load_check: {r['loader']}, vitrain {r['precision']}: rel L2 {r['rel_l2']:.3g}"
              f", max |diff| {r['max_abs_frac']:.3g} of max |logit|, top-1 agreement "
              f"{r['top1_agree']:.3f}: {'pass' if r['pass'] else 'FAIL'}", file=sys.stderr)
    for k, e in errors.items():
        print(f"timm_load_check: {k} did not load: {e}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
