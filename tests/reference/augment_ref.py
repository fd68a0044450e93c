"""Reference outputs of the PIL/torchvision image operations behind timm's augmentation, for
tests/test_augment_torch.cpp: resized crop (bilinear, bicubic), flip, colour adjustments, the eval
resize + centre crop, and every RandAugment op at fixed magnitudes (args as timm's level functions,
random sign fixed to +, geometric ops bilinear with the ImageNet mean fill).
Usage: /usr/bin/python3 augment_ref.py --out DIR   (writes DIR/augment.safetensors)"""
import argparse
import math
import os

import numpy as np
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from torch_vit import write_safetensors

FILL = (124, 116, 104)  # round(ImageNet mean * 255), timm's img_mean


def test_image(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255.0 / w, y * 255.0 / h, (x + y) * 127.0 / (w + h) + 60])
    img = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)  # (3, h, w)
    return Image.fromarray(np.ascontiguousarray(img.transpose(1, 2, 0)), "RGB")


def chw(img):
    return np.asarray(img, dtype=np.float32).transpose(2, 0, 1).copy()


# timm auto_augment.py level -> arg (level in [0, 10], sign +).
def level_arg(op, level):
    l = level / 10.0
    table = {
        "Rotate": l * 30.0, "ShearX": l * 0.3, "ShearY": l * 0.3,
        "TranslateXRel": l * 0.45, "TranslateYRel": l * 0.45,
        "Posterize": int(l * 4), "PosterizeIncreasing": 4 - int(l * 4),
        "Solarize": int(l * 256), "SolarizeIncreasing": 256 - int(l * 256),
        "SolarizeAdd": int(l * 110),
    }
    for e in ("Color", "Contrast", "Brightness", "Sharpness"):
        table[e] = l * 1.8 + 0.1
        table[e + "Increasing"] = 1.0 + l * 0.9
    return table.get(op, 0.0)


def solarize_add(img, add, thresh=128):
    lut = [min(255, i + add) if i < thresh else i for i in range(256)]
    return img.point(lut * 3)


def ra_op(img, op, arg, resample=Image.BILINEAR):
    kw = dict(resample=resample, fillcolor=FILL)
    w, h = img.size
    base = op.replace("Increasing", "")
    if op == "AutoContrast":
        return ImageOps.autocontrast(img)
    if op == "Equalize":
        return ImageOps.equalize(img)
    if op == "Invert":
        return ImageOps.invert(img)
    if op == "Rotate":
        return img.rotate(arg, **kw)
    if base == "Posterize":
        return img if arg >= 8 else ImageOps.posterize(img, arg)
    if base == "Solarize":
        return ImageOps.solarize(img, arg)
    if op == "SolarizeAdd":
        return solarize_add(img, arg)
    enh = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast,
           "Brightness": ImageEnhance.Brightness, "Sharpness": ImageEnhance.Sharpness}
    if base in enh:
        return enh[base](img).enhance(arg)
    m = {"ShearX": (1, arg, 0, 0, 1, 0), "ShearY": (1, 0, 0, arg, 1, 0),
         "TranslateXRel": (1, 0, arg * w, 0, 1, 0), "TranslateYRel": (1, 0, 0, 0, 1, arg * h)}[op]
    return img.transform(img.size, Image.AFFINE, m, **kw)


RA_OPS = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
          "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel",
          "TranslateYRel", "PosterizeIncreasing", "SolarizeIncreasing", "ColorIncreasing",
          "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    img = test_image(29, 37, 0)  # PIL size (w 37, h 29)
    out = {"src": chw(img)}
    bil, bic = T.InterpolationMode.BILINEAR, T.InterpolationMode.BICUBIC
    for name, mode in (("bilinear", bil), ("bicubic", bic)):
        # resized_crop(top 3, left 5, height 20, width 25) -> 24x24 (down in x, up in y)
        out[f"crop_{name}"] = chw(TF.resized_crop(img, 3, 5, 20, 25, [24, 24], mode))
        out[f"down_{name}"] = chw(TF.resize(img, [11, 13], mode))
        out[f"up_{name}"] = chw(TF.resize(img, [45, 50], mode))
        out[f"eval_{name}"] = chw(T.CenterCrop(24)(T.Resize(math.floor(24 / 0.875), mode)(img)))
    out["hflip"] = chw(TF.hflip(img))
    for f in (0.6, 1.4):
        out[f"brightness_{f}"] = chw(TF.adjust_brightness(img, f))
        out[f"contrast_{f}"] = chw(TF.adjust_contrast(img, f))
        out[f"saturation_{f}"] = chw(TF.adjust_saturation(img, f))
    for op in RA_OPS:
        for level in (3, 9):
            out[f"ra_{op}_{level}"] = chw(ra_op(img, op, level_arg(op, level)))
    for op in ("Rotate", "ShearX", "TranslateYRel"):
        out[f"ra_{op}_9_bicubic"] = chw(ra_op(img, op, level_arg(op, 9), Image.BICUBIC))
    write_safetensors(os.path.join(args.out, "augment.safetensors"), out,
                      {"fill": ",".join(map(str, FILL))})


if __name__ == "__main__":
    main()
