"""Checks a vitrain pack (OUT/<split>.vitpack) against the folder it was made from.

  rehearsal_check.py PACK MANIFEST SPLIT MAX_SIDE [--ref REF_PACK] [--sums FILE]
  rehearsal_check.py --compare-runs REF_RUN RUN RESUMED_FROM_STEP

MANIFEST is bench/make_imagenet_like.py's manifest.tsv. The pack must hold exactly the split's
decodable files (all but the manifest's empty and truncated ones), in vitrain's index order
(label, then path byte-wise), each with its label and a size that is the source's scaled to a
longer side of MAX_SIDE (+-1 px: the DCT-domain downscale rounds first). With --ref every
record's stored bytes must have the same sha256 as the reference pack's (an uninterrupted
prepare). With --pixels SPLIT_DIR (a pack made with --format raw --max-side 0) every record's
pixels must be PIL's decode of its file, within 1 level on average: CMYK, greyscale and PNG
files decoded right. --sums writes one sha256 per record. Prints one JSON line; exit 1 on any mismatch.

--compare-runs: RUN (killed and resumed) must have REF_RUN's loss at every step and the same
final weights and EMA weights, bit for bit; the line lists the EfficientTrain++ stages of the
steps after RESUMED_FROM_STEP.
"""
import argparse
import hashlib
import json
import mmap
import struct
import sys

SKIPPED_KINDS = ("empty", "truncated")


def read_pack(path, keep_bytes=False):
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if mm[:8] != b"VITPACK1":
        raise ValueError(f"{path}: not a vitpack (magic {mm[:8]!r})")
    (version, fmt, count, ncls, max_side, names_bytes, data_off, index_off,
     quality) = struct.unpack_from("<IIQIIQQQI", mm, 8)
    if index_off + 24 * count != len(mm):
        raise ValueError(f"{path}: size {len(mm)} != index end {index_off + 24 * count}")
    classes, at = [], 64
    for _ in range(ncls):
        (n,) = struct.unpack_from("<I", mm, at)
        classes.append(mm[at + 4:at + 4 + n].decode("utf-8"))
        at += 4 + n
    records = []
    for i in range(count):
        off, size, label, h, w, c, mode = struct.unpack_from("<QIiHHBB", mm, index_off + 24 * i)
        blob = mm[data_off + off:data_off + off + size]
        records.append({"label": label, "h": h, "w": w, "c": c, "mode": mode,
                        "sha256": hashlib.sha256(blob).hexdigest(),
                        "blob": blob if keep_bytes else None})
    return {"classes": classes, "max_side": max_side, "records": records}


def expected_rows(manifest, split):
    rows = []
    with open(manifest, encoding="utf-8") as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(head, line.rstrip("\n").split("\t")))
            if r["split"] == split:
                rows.append(r)
    rows.sort(key=lambda r: (int(r["label"]), r["path"].encode("utf-8")))
    return rows


def scaled(w, h, max_side):
    longer = max(w, h)
    if max_side <= 0 or longer <= max_side:
        return w, h
    s = max_side / longer
    return min(max_side, max(1, round(w * s))), min(max_side, max(1, round(h * s)))


def tensor_bytes(path):
    """The tensors of a safetensors file (name -> bytes), metadata left out."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in head.items() if k != "__metadata__"}


def train_records(run):
    """step -> (loss text, stage) of a run's log.jsonl (a resumed step's last record wins)."""
    out = {}
    with open(f"{run}/log.jsonl") as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "train":
                out[j["step"]] = (repr(j["loss"]), j.get("stage"))
    return out


def compare_runs(ref, got, resumed_from):
    """Exit 1 unless run `got` has run `ref`'s every loss and final weights, raw and EMA."""
    a, b = train_records(ref), train_records(got)
    errors = []
    if a != b:
        bad = [s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
        errors.append(f"{len(bad)} of {len(a)} steps differ, first {bad[:3]}: "
                      f"{[a.get(s) for s in bad[:3]]} vs {[b.get(s) for s in bad[:3]]}")
    for f in ("last.safetensors", "last_ema.safetensors"):
        if tensor_bytes(f"{ref}/{f}") != tensor_bytes(f"{got}/{f}"):
            errors.append(f"{f} differs")
    after = sorted({st for s, (_, st) in b.items() if s > resumed_from})
    print(json.dumps({"steps": len(a), "resumed_from": resumed_from,
                      "stages_after_resume": after, "ok": not errors, "errors": errors}))
    return 0 if not errors else 1


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--compare-runs":
        return compare_runs(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    p = argparse.ArgumentParser()
    p.add_argument("pack")
    p.add_argument("manifest")
    p.add_argument("split")
    p.add_argument("max_side", type=int)
    p.add_argument("--ref")
    p.add_argument("--sums")
    p.add_argument("--pixels", help="the split's folder: compare a raw, full-size pack's pixels")
    a = p.parse_args()
    pack = read_pack(a.pack, keep_bytes=bool(a.pixels))
    rows = expected_rows(a.manifest, a.split)
    want = [r for r in rows if r["kind"] not in SKIPPED_KINDS]
    errors = []
    recs = pack["records"]
    if len(recs) != len(want):
        errors.append(f"{len(recs)} records, expected {len(want)} (of {len(rows)} files)")
    for i, (rec, row) in enumerate(zip(recs, want)):
        if rec["label"] != int(row["label"]):
            errors.append(f"record {i} ({row['path']}): label {rec['label']} != {row['label']}")
        ew, eh = scaled(int(row["width"]), int(row["height"]), a.max_side)
        if abs(rec["w"] - ew) > 1 or abs(rec["h"] - eh) > 1:
            errors.append(f"record {i} ({row['path']}): {rec['w']}x{rec['h']}, expected {ew}x{eh}")
        if rec["c"] not in (1, 3):
            errors.append(f"record {i} ({row['path']}): {rec['c']} channels")
    if a.ref:
        ref = read_pack(a.ref)["records"]
        diff = sum(1 for x, y in zip(recs, ref) if x["sha256"] != y["sha256"])
        if len(ref) != len(recs) or diff:
            errors.append(f"{diff} records differ from the reference pack "
                          f"({len(recs)} vs {len(ref)} records)")
    if a.pixels:  # raw records at full size against PIL's decode of each source file
        import numpy as np
        from PIL import Image
        for i, (rec, row) in enumerate(zip(recs, want)):
            got = np.frombuffer(rec["blob"], np.uint8).astype(int)
            with Image.open(f"{a.pixels}/{row['path']}") as im:
                ref = np.asarray(im.convert("RGB" if rec["c"] == 3 else "L")).astype(int)
            if rec["mode"] != 0 or got.size != ref.size:
                errors.append(f"record {i} ({row['path']}): not raw at the source's size")
            elif np.abs(got - ref.reshape(-1)).mean() > 1.0:
                errors.append(f"record {i} ({row['kind']} {row['path']}): pixels differ from "
                              f"PIL's by {np.abs(got - ref.reshape(-1)).mean():.2f} on average")
    if a.sums:
        with open(a.sums, "w") as f:
            f.write("".join(r["sha256"] + "\n" for r in recs))
    kinds = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(json.dumps({"pack": a.pack, "records": len(recs), "files": len(rows),
                      "expected_skipped": len(rows) - len(want), "kinds": kinds,
                      "ok": not errors, "errors": errors[:10]}))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
