"""Writes an ImageFolder shaped like ImageNet-1k, for rehearsing the ImageNet recipe without it.

OUT/train/<synset>/<synset>_<i>.JPEG and OUT/val/<synset>/..., 1,000 class folders named like
ImageNet's synsets (n01440764, ...; drawn from --seed), file i of a split in class i mod
--classes. Every image is an affine warp (rotation, scale, crop) of one of the photographs that
Debian's python3-skimage ships (skimage.data: astronaut, coffee, rocket, retina, camera, ...),
then a colour shift (a random 3x3 channel mix plus offsets), saved as JPEG with a random quality
of 75..95, so no two files are equal (the manifest's sha256 column shows it).

Sizes are spread like ImageNet's: 60% of files take one of its common sizes (500x375, 500x333,
500x500, portrait too), the rest a short side of 200..800 px with an aspect of 3:4..4:3, and 2%
an extreme aspect (1:3..3:1). --scale multiplies every size (a small, quick rehearsal set).

The oddities real ImageNet has, placed at fixed positions of each split (when it has at least
32 files): CMYK JPEGs, greyscale JPEGs, a PNG named .JPEG, a truncated JPEG, an empty file, a
file eight folders deep, and non-ASCII file names; plus a hidden .DS_Store that readers ignore.

OUT/manifest.tsv has one row per file: split, path under the split, label (index of the class
in sorted order), kind (plain, cmyk, grey, png, truncated, empty, deep, unicode), width, height,
bytes, sha256. Deterministic for a given --seed whatever -j is (each file draws from its own
random stream, seeded by (seed, split, index)).

  /usr/bin/python3 bench/make_imagenet_like.py --out /tmp/inet --train 100000 --val 5000 -j 2
  /usr/bin/python3 bench/make_imagenet_like.py --out /tmp/small --train 300 --val 100 --scale 0.25
"""
import argparse
import hashlib
import io
import math
import multiprocessing
import os
import random
import sys
import warnings

COLOUR = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina", "colorwheel"]
GREY = ["camera", "brick", "grass", "gravel", "moon", "clock", "coins", "cell"]
COMMON = [(500, 375), (500, 333), (500, 500), (375, 500), (333, 500), (500, 400), (400, 300)]
ODD_KINDS = ["cmyk", "cmyk", "cmyk", "grey", "grey", "grey", "png", "truncated", "empty",
             "deep", "unicode", "unicode"]
UNICODE_STEMS = ["café_ünïcødé", "写真_фото"]

PHOTOS = None  # per worker: list of PIL RGB images


def load_photos():
    from PIL import Image
    from skimage import data  # Debian: apt-get install python3-skimage
    photos = []
    for name in COLOUR + GREY:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                img = getattr(data, name)()
        except Exception:  # not shipped in this build (would need a download)
            continue
        if img.ndim == 3:
            photos.append(Image.fromarray(img[:, :, :3]).convert("RGB"))
        else:
            photos.append(Image.fromarray(img).convert("RGB"))
    if len(photos) < 4:
        sys.exit("error: fewer than 4 skimage.data photos could be loaded")
    return photos


def init_worker():
    global PHOTOS
    PHOTOS = load_photos()


def pick_size(rng, scale):
    u = rng.random()
    if u < 0.02:  # extreme aspect, like ImageNet's panoramas and poles
        short = rng.randint(150, 400)
        long_ = int(short * rng.uniform(2.0, 3.0))
        w, h = (long_, short) if rng.random() < 0.5 else (short, long_)
    elif u < 0.62:
        w, h = rng.choice(COMMON)
    else:
        short = int(math.exp(rng.uniform(math.log(200), math.log(800))))
        aspect = rng.uniform(1.0, 4 / 3)
        long_ = int(short * aspect)
        w, h = (long_, short) if rng.random() < 0.7 else (short, long_)
    return max(16, int(w * scale)), max(16, int(h * scale))


def render(rng, w, h):
    """An affine warp of a random photo to (w, h), then a random colour shift."""
    from PIL import Image
    photo = rng.choice(PHOTOS)
    pw, ph = photo.size
    theta = math.radians(rng.uniform(-20, 20))
    c, s = abs(math.cos(theta)), abs(math.sin(theta))
    # Largest source-units-per-output-pixel k whose rotated output box still fits the photo.
    k_max = min(pw / (c * w + s * h), ph / (s * w + c * h))
    k = k_max * rng.uniform(0.35, 1.0)
    half_x, half_y = (c * w + s * h) * k / 2, (s * w + c * h) * k / 2
    cx = rng.uniform(half_x, pw - half_x)
    cy = rng.uniform(half_y, ph - half_y)
    if rng.random() < 0.5:  # mirror
        a, b, d, e = k * math.cos(theta), -k * math.sin(theta), k * math.sin(theta), k * math.cos(theta)
        a, d = -a, -d
    else:
        a, b, d, e = k * math.cos(theta), -k * math.sin(theta), k * math.sin(theta), k * math.cos(theta)
    # Output (x, y) -> source (a x + b y + c0, d x + e y + f0), centred.
    c0 = cx - a * w / 2 - b * h / 2
    f0 = cy - d * w / 2 - e * h / 2
    img = photo.transform((w, h), Image.AFFINE, (a, b, c0, d, e, f0), resample=Image.BILINEAR)
    # Colour shift: a random channel mix around the identity, gains and offsets.
    m = []
    for row in range(3):
        gains = [rng.uniform(-0.25, 0.25) for _ in range(3)]
        gains[row] += rng.uniform(0.75, 1.2)
        m += gains + [rng.uniform(-30, 30)]
    return img.convert("RGB", tuple(m))


def jpeg_bytes(img, quality):
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def odd_positions(n):
    """Index -> oddity kind, at fixed spread-out positions of a split of n files."""
    if n < 32:
        return {}
    return {(j + 1) * n // (len(ODD_KINDS) + 1): kind for j, kind in enumerate(ODD_KINDS)}


def make_file(job):
    out, split, i, seed, classes, scale, kind = job
    rng = random.Random(f"{seed}:{split}:{i}")
    label = i % len(classes)
    syn = classes[label]
    w, h = pick_size(rng, scale)
    img = render(rng, w, h)
    quality = rng.randint(75, 95)
    name = f"{syn}_{i}.JPEG"
    rel_dir = syn
    if kind == "cmyk":
        data = jpeg_bytes(img.convert("CMYK"), quality)
    elif kind == "grey":
        data = jpeg_bytes(img.convert("L"), quality)
    elif kind == "png":  # ImageNet's n02105855_2933.JPEG is a PNG
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        data = buf.getvalue()
    elif kind == "truncated":
        full = jpeg_bytes(img, quality)
        data = full[: len(full) * 3 // 5]
    elif kind == "empty":
        data = b""
    else:
        data = jpeg_bytes(img, quality)
    if kind == "deep":
        rel_dir = "/".join([syn] + [f"d{j}" for j in range(8)])
    if kind == "unicode":
        name = f"{syn}_{UNICODE_STEMS[i % len(UNICODE_STEMS)]}_{i}.JPEG"
    os.makedirs(os.path.join(out, split, rel_dir), exist_ok=True)
    rel = f"{rel_dir}/{name}"
    with open(os.path.join(out, split, rel), "wb") as f:
        f.write(data)
    sha = hashlib.sha256(data).hexdigest()
    return f"{split}\t{rel}\t{label}\t{kind}\t{w}\t{h}\t{len(data)}\t{sha}"


def synsets(seed, count):
    rng = random.Random(f"{seed}:synsets")
    return sorted(f"n{d:08d}" for d in rng.sample(range(1_000_000, 15_000_000), count))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output root (train/, val/, manifest.tsv)")
    p.add_argument("--train", type=int, default=1300, help="training files")
    p.add_argument("--val", type=int, default=500, help="validation files")
    p.add_argument("--classes", type=int, default=1000, help="class folders per split")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every image size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-j", "--workers", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    if a.train < 1 or a.val < 0 or a.classes < 1 or a.workers < 1 or not 0 < a.scale <= 4:
        sys.exit("error: need --train >= 1, --val >= 0, --classes >= 1, -j >= 1, 0 < --scale <= 4")
    if os.path.exists(os.path.join(a.out, "manifest.tsv")):
        sys.exit(f"error: {a.out} already holds a generated set (manifest.tsv); remove it first")
    classes = synsets(a.seed, a.classes)
    for split in ("train", "val"):
        for syn in classes:  # every class folder exists, as in ImageNet, even if empty here
            os.makedirs(os.path.join(a.out, split, syn), exist_ok=True)
    with open(os.path.join(a.out, "train", classes[0], ".DS_Store"), "wb") as f:
        f.write(b"\0\0\0\1Bud1")
    jobs = []
    for split, n in (("train", a.train), ("val", a.val)):
        odd = odd_positions(n)
        jobs += [(a.out, split, i, a.seed, classes, a.scale, odd.get(i, "plain")) for i in range(n)]
    rows = []
    with multiprocessing.Pool(a.workers, initializer=init_worker) as pool:
        for k, row in enumerate(pool.imap(make_file, jobs, chunksize=64)):
            rows.append(row)
            if (k + 1) % 10000 == 0:
                print(f"{k + 1}/{len(jobs)} files", file=sys.stderr, flush=True)
    tmp = os.path.join(a.out, "manifest.tsv.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("split\tpath\tlabel\tkind\twidth\theight\tbytes\tsha256\n")
        f.write("\n".join(rows) + "\n")
    os.replace(tmp, os.path.join(a.out, "manifest.tsv"))
    print(f"wrote {a.train} train + {a.val} val files in {a.classes} classes to {a.out}")


if __name__ == "__main__":
    main()
