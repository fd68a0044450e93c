"""Writes an ImageFolder of real-photo JPEGs for the input-pipeline benchmark (bench/compare_data.sh).

The photographs are the colour images that Debian's python3-skimage ships (skimage.data:
astronaut, coffee, chelsea, rocket, ...), or with --photos-dir DIR every *.png/*.jpg/*.jpeg in
DIR (read with PIL, converted to RGB); each photo is a class (named after its file stem with
--photos-dir). Photos with a side under 256 px are skipped; at least 2 must remain. Every
sample is a random crop of its photo (30-100% of the area, aspect 3:4..4:3), resized to an
ImageNet-like size (500x375, 375x500, 500x333, 500x500, ...) and saved as JPEG quality 90
(4:2:0), so decoding cost matches ImageNet's typical files.

Deterministic for a given --seed whatever -j/--workers is: each image draws from its own random
stream, seeded by (seed, split, index), so the processes need not share one sequence. (Earlier
versions drew every image from one sequential stream, so a given --seed now makes different
images than it did then.)

--save-photos DIR writes the skimage photos it would use as lossless PNGs (DIR/name.png) and
exits, so a machine with skimage can make the source set for one without it; the images made
from those PNGs with --photos-dir are the same as those made from skimage directly.

  /usr/bin/python3 bench/make_photo_jpegs.py --out /tmp/photos --train 1000 --val 200
  /usr/bin/python3 bench/make_photo_jpegs.py --save-photos gpu_bundle/photos    # has skimage
  python3 bench/make_photo_jpegs.py --photos-dir gpu_bundle/photos --out /tmp/inet \\
      --train 50000 --val 1000 -j 16                                           # no skimage
"""
import argparse
import multiprocessing
import os
import random
import sys
import warnings

# Colour photographs in skimage.data; any a given skimage build cannot load offline is skipped.
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina"]
SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (400, 300), (500, 400)]
MIN_SIDE = 256  # smaller photos would be upscaled to 500 px: blurry, unlike ImageNet's files
EXTENSIONS = (".png", ".jpg", ".jpeg")


def load_skimage_photos(Image):
    from skimage import data  # Debian: apt-get install python3-skimage
    photos = {}
    for name in PHOTOS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                img = getattr(data, name)()
        except Exception:  # not shipped in this build (would need a download)
            continue
        if img.ndim == 3 and img.shape[2] >= 3 and min(img.shape[:2]) >= MIN_SIDE:
            photos[name] = Image.fromarray(img[:, :, :3])
    return photos


def load_dir_photos(folder, Image):
    photos = {}
    for fname in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(fname)
        if ext.lower() not in EXTENSIONS:
            continue
        if stem in photos:
            sys.exit(f"error: two photos named {stem!r} in {folder}: class names must differ")
        with Image.open(os.path.join(folder, fname)) as f:
            img = f.convert("RGB")
        if min(img.size) >= MIN_SIDE:
            photos[stem] = img
        else:
            print(f"skipped {fname}: {img.size[0]}x{img.size[1]}, a side under {MIN_SIDE} px",
                  file=sys.stderr)
    return photos


def sample(rng, photo, Image):
    w, h = photo.size
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
    img = photo.crop((x, y, x + cw, y + ch)).resize((out_w, out_h), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


# Per-process state for the workers: set once by init() (inherited on fork, pickled on spawn)
# rather than shipped with every task.
_job = {}


def init(photos, out, seed, quality):
    from PIL import Image
    _job.update(photos=photos, names=sorted(photos), out=out, seed=seed, quality=quality,
                Image=Image)


def make(task):
    split, i = task
    names = _job["names"]
    name = names[i % len(names)]
    # A string seed goes through SHA-512 (not hash()), so it is the same in every process.
    rng = random.Random(f"{_job['seed']}-{split}-{i}")
    sample(rng, _job["photos"][name], _job["Image"]).save(
        os.path.join(_job["out"], split, name, f"{i:05d}.jpg"),
        quality=_job["quality"], subsampling=2)


def save_photos(folder, photos):
    os.makedirs(folder, exist_ok=True)
    for name in sorted(photos):
        path = os.path.join(folder, name + ".png")
        photos[name].save(path)
        print(f"wrote {path} ({photos[name].size[0]}x{photos[name].size[1]})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="ImageFolder root to create (train/, val/)")
    ap.add_argument("--train", type=int, default=1000, help="training images in all")
    ap.add_argument("--val", type=int, default=200, help="validation images in all")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--seed", type=int, default=0)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--photos-dir", metavar="DIR",
                     help="source photos from DIR/*.png|jpg|jpeg instead of skimage.data")
    src.add_argument("--save-photos", metavar="DIR",
                     help="write the skimage photos as DIR/name.png and exit (no --out needed)")
    ap.add_argument("-j", "--workers", type=int, default=1,
                    help="processes making the JPEGs (the output is the same for any count)")
    args = ap.parse_args()
    if args.save_photos is None and args.out is None:
        ap.error("--out is required (unless --save-photos)")
    if args.workers < 1:
        ap.error("-j/--workers must be at least 1")
    from PIL import Image
    if args.photos_dir is not None:
        if not os.path.isdir(args.photos_dir):
            sys.exit(f"error: --photos-dir {args.photos_dir} is not a directory")
        photos = load_dir_photos(args.photos_dir, Image)
        if len(photos) < 2:
            sys.exit(f"error: fewer than 2 colour photos of at least {MIN_SIDE} px a side in "
                     f"{args.photos_dir} (*.png, *.jpg, *.jpeg)")
    else:
        photos = load_skimage_photos(Image)
        if len(photos) < 2:
            sys.exit("error: fewer than 2 colour photos in skimage.data "
                     "(apt-get install python3-skimage, or use --photos-dir)")
    if args.save_photos is not None:
        save_photos(args.save_photos, photos)
        return
    names = sorted(photos)
    tasks = []
    for split, total in (("train", args.train), ("val", args.val)):
        for name in names[:total]:  # folders made here, so the workers never race on them
            os.makedirs(os.path.join(args.out, split, name), exist_ok=True)
        tasks += [(split, i) for i in range(total)]
    init_args = (photos, args.out, args.seed, args.quality)
    if args.workers == 1:
        init(*init_args)
        for t in tasks:
            make(t)
    else:
        with multiprocessing.Pool(args.workers, initializer=init, initargs=init_args) as pool:
            # Chunks amortise the task round trips; iterating re-raises a worker's exception.
            for _ in pool.imap_unordered(make, tasks, chunksize=32):
                pass
    print(f"wrote {args.train} train + {args.val} val JPEGs ({len(names)} classes: "
          f"{', '.join(names)}) to {args.out}")


if __name__ == "__main__":
    main()
