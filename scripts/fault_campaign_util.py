"""Helpers of scripts/fault_campaign.sh (data generation, run comparison, waiting, damage).
Usage: python3 fault_campaign_util.py <command> ARGS..."""
import gzip
import json
import os
import random
import struct
import sys
import time


def toy_idx(out, n_train, n_test):
    """The tests' learnable toy set (tests/cli_harness.h): 8x8, class k has k + 1 bright
    quadrants."""
    os.makedirs(out, exist_ok=True)
    rng = random.Random(3)
    for prefix, n in (("train", int(n_train)), ("t10k", int(n_test))):
        img = bytearray(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 8, 8))
        lab = bytearray(struct.pack(">BBBBI", 0, 0, 8, 1, n))
        for _ in range(n):
            k = rng.randrange(4)
            lab.append(k)
            bright = set(rng.sample(range(4), k + 1))
            for y in range(8):
                for x in range(8):
                    q = (y // 4) * 2 + x // 4
                    img.append(200 + rng.randrange(50) if q in bright else rng.randrange(40))
        with gzip.open(os.path.join(out, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
            f.write(bytes(img))
        with gzip.open(os.path.join(out, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(bytes(lab))


def image_folder(out, n_train, n_val):
    """An ImageFolder of small PNGs in 3 classes (the class is the dominant colour)."""
    from PIL import Image
    rng = random.Random(4)
    for split, n in (("train", int(n_train)), ("val", int(n_val))):
        for i in range(n):
            k = i % 3
            d = os.path.join(out, split, f"c{k}")
            os.makedirs(d, exist_ok=True)
            px = bytearray()
            for _ in range(24 * 24):
                c = [rng.randrange(60) for _ in range(3)]
                c[k] = 150 + rng.randrange(100)
                px += bytes(c)
            Image.frombytes("RGB", (24, 24), bytes(px)).save(os.path.join(d, f"{i}.png"))


def losses(run):
    """The last logged loss of every step (a resumed run logs the steps after its checkpoint
    twice; the later entry is the resumed one)."""
    out = {}
    with open(os.path.join(run, "log.jsonl")) as f:
        for line in f:
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            if j.get("type") == "train":
                out[j["step"]] = j["loss"]
    return out


def tensor_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return json.dumps(header, sort_keys=True), data[8 + n:]


def same_run(ref, run):
    a, b = losses(ref), losses(run)
    if a != b:
        diff = [s for s in a if a.get(s) != b.get(s)][:3]
        print(f"losses differ at steps {diff} ({len(a)} vs {len(b)} steps)", file=sys.stderr)
        return 1
    if tensor_bytes(os.path.join(ref, "last.safetensors")) != \
            tensor_bytes(os.path.join(run, "last.safetensors")):
        print("final weights differ", file=sys.stderr)
        return 1
    return 0


def state_step(run):
    with open(os.path.join(run, "state.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        print(json.loads(f.read(n))["__metadata__"]["step"])


def wait_for(path, timeout):
    end = time.time() + float(timeout)
    while not os.path.exists(path) and time.time() < end:
        time.sleep(0.02)


def corrupt_images(folder, count):
    """Overwrites `count` image files with garbage (not decodable)."""
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)
    for p in random.Random(5).sample(files, int(count)):
        with open(p, "wb") as f:
            f.write(b"this is not an image")


def truncate_file(path):
    os.truncate(path, os.path.getsize(path) // 2)


COMMANDS = {"toy-idx": toy_idx, "image-folder": image_folder, "same-run": same_run,
            "state-step": state_step, "wait-for": wait_for, "corrupt-images": corrupt_images,
            "truncate-file": truncate_file}

if __name__ == "__main__":
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]) or 0)
