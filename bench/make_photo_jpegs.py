"""Writes an ImageFolder of real-photo JPEGs for the input-pipeline benchmark (bench/compare_data.sh).

The photographs are the colour images that Debian's python3-skimage ships (skimage.data:
astronaut, coffee, chelsea, rocket, ...); each one is a class. Every sample is a random crop of
its photo (30-100% of the area, aspect 3:4..4:3), resized to an ImageNet-like size (500x375,
375x500, 500x333, 500x500, ...) and saved as JPEG quality 90 (4:2:0), so decoding cost matches
ImageNet's typical files. Deterministic for a given --seed.

  /usr/bin/python3 bench/make_photo_jpegs.py --out /tmp/photos --train 1000 --val 200
"""
import argparse
import os
import random
import sys
import warnings

# Colour photographs in skimage.data; any a given skimage build cannot load offline is skipped.
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina"]
SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (400, 300), (500, 400)]


def load_photos():
    from skimage import data  # Debian: apt-get install python3-skimage
    photos = {}
    for name in PHOTOS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                img = getattr(data, name)()
        except Exception:  # not shipped in this build (would need a download)
            continue
        if img.ndim == 3 and img.shape[2] >= 3 and min(img.shape[:2]) >= 256:
            photos[name] = img[:, :, :3]
    return photos


def sample(rng, photo, Image):
    h, w = photo.shape[:2]
    for _ in range(10):
        area = rng.uniform(0.3, 1.0) * h * w
        aspect = rng.uniform(0.75, 4 / 3)
        ch, cw = int(round((area / aspect) ** 0.5)), int(round((area * aspect) ** 0.5))
        if ch <= h and cw <= w:
            break
    else:
        ch, cw = h, w
    y, x = rng.randint(0, h - ch), rng.randint(0, w - cw)
    out_w, out_h = rng.choice(SIZES)
    img = Image.fromarray(photo[y:y + ch, x:x + cw]).resize((out_w, out_h), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="ImageFolder root to create (train/, val/)")
    ap.add_argument("--train", type=int, default=1000, help="training images in all")
    ap.add_argument("--val", type=int, default=200, help="validation images in all")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from PIL import Image
    photos = load_photos()
    if len(photos) < 2:
        sys.exit("error: fewer than 2 colour photos in skimage.data "
                 "(apt-get install python3-skimage)")
    rng = random.Random(args.seed)
    names = sorted(photos)
    for split, total in (("train", args.train), ("val", args.val)):
        for i in range(total):
            name = names[i % len(names)]
            folder = os.path.join(args.out, split, name)
            os.makedirs(folder, exist_ok=True)
            sample(rng, photos[name], Image).save(
                os.path.join(folder, f"{i:05d}.jpg"), quality=args.quality, subsampling=2)
    print(f"wrote {args.train} train + {args.val} val JPEGs ({len(names)} classes: "
          f"{', '.join(names)}) to {args.out}")


if __name__ == "__main__":
    main()
