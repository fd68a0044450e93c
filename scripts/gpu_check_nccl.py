#!/usr/bin/env python3
"""Issue 50's device check (run by scripts/gpu_check_nccl.sh, which sets the environment).

Two ranks on one GPU (NCCL 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1) against one rank with the same
global batch, on a toy data set (512 train / 128 eval images, 8x8, vit_fmnist_tiny):
  equivalence  plain data parallel and ZeRO-1, accumulation 1 and 3, fp32 and bf16, under
               mpirun: per-update losses within 1e-5 relative (fp32) or BF16_TOL (bf16)
  resume       a 2-rank checkpoint resumes on 1 rank, a 1-rank one on 2; both continue the
               straight 1-rank loss curve
  sigstop      SIGSTOP one rank: the launcher exits non-zero within --dist-timeout + 30 s, and
               a rank's stderr names the operation that did not finish
  memory       while the SIGSTOP job trains, each rank's device memory (nvidia-smi) stays
               within one rank's plus NCCL_MIB (NCCL's own buffers)
  torchrun     the fp32 plain case and the SIGSTOP case under torchrun --no_python
On the CPU (GPU_CHECK_DRY=1, DEVICE=cpu) the same steps run over MPI; bf16 is left out and the
torchrun steps run `vitrain launch-check` (torchrun jobs on the CPU are refused by design). With
a stub vitrain (no `launch-check`) it only lists the commands.
Writes OUTDIR/results.json (one entry per check: name, status PASS/FAIL/SKIP, figures, the
command) and OUTDIR/log_tail.txt. Exit 0 when no check failed.
"""
import gzip
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

DEST = sys.argv[1]
BIN = os.environ.get("BIN", "build")
VITRAIN = os.path.abspath(os.path.join(BIN, "vitrain"))
DEVICE = os.environ.get("DEVICE", "cuda")
DRY = os.environ.get("GPU_CHECK_DRY", "0") == "1"
VIT_LD = os.environ.get("VIT_LD_LIBRARY_PATH", "")
NCCL_DIR = os.environ.get("VIT_NCCL_DIR", "")
FP32_TOL = 1e-5
# bf16 keeps 8 significand bits: a reduction order that moves an fp32 sum by one ulp can flip
# the rounding of bf16 casts downstream, and the loss may move by a few bf16 ulps (2^-8 each).
BF16_TOL = float(os.environ.get("BF16_TOL", 4 * 2.0**-8))
DIST_TIMEOUT = int(os.environ.get("NCCL_CHECK_DIST_TIMEOUT", "20"))
# A rank of two may hold NCCL's own channel buffers and its CUDA context's share beyond one
# rank's memory; the model state itself must not grow with the world size.
NCCL_MIB = int(os.environ.get("NCCL_CHECK_NCCL_MIB", "1024"))
WORK = os.path.join(DEST, "work")
DATA = os.path.join(WORK, "data")
OUTP = os.path.join(WORK, "out")
results = []
log_lines = []


def log(msg):
    print(msg, flush=True)
    log_lines.append(msg)


def write_toy_idx(d, n_train=512, n_test=128, size=8):
    os.makedirs(d, exist_ok=True)
    rng = random.Random(3)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = [rng.randrange(4) for _ in range(n)]
        img = bytearray(struct.pack(">IIII", 0x803, n, size, size))
        for k in labels:  # class k: quadrant k bright
            for y in range(size):
                for x in range(size):
                    q = (y // (size // 2)) * 2 + x // (size // 2)
                    img.append(200 + rng.randrange(50) if q == k else rng.randrange(40))
        lab = bytearray(struct.pack(">II", 0x801, n)) + bytes(labels)
        with gzip.open(os.path.join(d, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
            f.write(bytes(img))
        with gzip.open(os.path.join(d, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(bytes(lab))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def env_for(ranks):
    e = dict(os.environ)
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_btl_vader_single_copy_mechanism="none",
             OMPI_MCA_rmaps_base_oversubscribe="1", GOMP_SPINCOUNT="1000")
    libs = [p for p in (NCCL_DIR if ranks > 1 else "", VIT_LD) if p]
    if libs:
        e["LD_LIBRARY_PATH"] = ":".join(libs)
    if ranks > 1 and DEVICE == "cuda":
        e["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"  # two ranks, one GPU (NCCL >= 2.30)
    return e


def train_flags(name, accum=1, prec="fp32", extra=""):
    f = (f"train --data-dir {DATA} --model vit_fmnist_tiny --img-size 8 --output {OUTP} "
         f"--experiment {name} -b 48 --epochs 2 --lr 2e-3 --warmup-epochs 1 --log-interval 1 "
         f"-j 1 --seed 5 --hflip 0 --crop-pad 0 --device {DEVICE} --dist-timeout {DIST_TIMEOUT} "
         f"--grad-accum-steps {accum}")
    if DEVICE == "cuda":
        f += f" --precision {prec}"
    return (f + " " + extra).split()


def torchrun_cmd():
    """torchrun, or the same through the Python that has torch (pip installs may leave it off
    PATH); None when neither is there."""
    if shutil.which("torchrun"):
        return ["torchrun"]
    py = os.environ.get("PY", sys.executable)
    ok = subprocess.run([py, "-c", "import torch.distributed.run"], capture_output=True)
    return [py, "-m", "torch.distributed.run"] if ok.returncode == 0 else None


def nccl_version():
    """ncclGetVersion of the library the ranks load (VIT_NCCL_DIR first), e.g. 23007; 0 if none."""
    import ctypes
    for path in ([os.path.join(NCCL_DIR, "libnccl.so.2")] if NCCL_DIR else []) + ["libnccl.so.2"]:
        try:
            lib = ctypes.CDLL(path)
            v = ctypes.c_int(0)
            if lib.ncclGetVersion(ctypes.byref(v)) == 0:
                return v.value
        except OSError:
            continue
    return 0


TORCHRUN = None


def launch(ranks, launcher, args):
    """The command line of `vitrain ARGS` on `ranks` ranks."""
    if ranks == 1:
        return [VITRAIN] + args
    if launcher == "mpirun":
        # An ASan build (scripts/sanitize.sh): Open MPI's own allocations at exit are not ours.
        asan = ["-x", "ASAN_OPTIONS=detect_leaks=0"] if os.environ.get("ASAN_OPTIONS") else []
        return ["mpirun", "-np", str(ranks), "--oversubscribe"] + asan + [VITRAIN] + args
    return TORCHRUN + ["--no_python", "--nnodes", "1", "--nproc_per_node", str(ranks),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(WORK, "torchrun_logs"),
            VITRAIN] + args


def run(name, cmd, ranks, timeout=150):
    t0 = time.time()
    with open(os.path.join(WORK, name + ".log"), "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env_for(ranks),
                           timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, time.time() - t0


def tail(name, n=6):
    try:
        with open(os.path.join(WORK, name + ".log"), errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def losses(name):
    m = {}
    try:
        with open(os.path.join(OUTP, name, "log.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if j.get("type") == "train":
                    m[j["step"]] = j["loss"]
    except (OSError, ValueError):  # not there yet, or a line half written
        pass
    return m


def record(check, ok, cmd, **figures):
    status = "PASS" if ok else "FAIL"
    results.append(dict(check=check, status=status, command=" ".join(cmd), **figures))
    log(f"{status} {check} {json.dumps(figures)}")


def compare(check, got, ref, tol, cmd):
    a, b = losses(ref), losses(got)
    rel = max((abs(b[s] - a[s]) / max(abs(a[s]), 1e-30) for s in a if s in b), default=None)
    ok = bool(a) and set(a) == set(b) and rel is not None and rel <= tol
    record(check, ok, cmd, updates=len(b), ref_updates=len(a), max_rel_loss_diff=rel, tol=tol)
    if not ok:
        log(tail(got))


def pid_of_rank(rank, marker, var):
    want = f"{var}={rank}"
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if marker in cmd and cmd.startswith(VITRAIN) and want.encode() in env:
            return int(d)
    return None


def gpu_mib_by_pid():
    """{pid: MiB of device memory} from nvidia-smi; {} without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    m = {}
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            m[int(parts[0])] = int(parts[1])
    return m


def rank_mib(ranks, name, var):
    """Device MiB per rank of a running job (ranks 0..ranks-1), None where unknown."""
    usage = gpu_mib_by_pid()
    if ranks == 1:
        pid = next((int(d) for d in os.listdir("/proc") if d.isdigit() and _is_run(d, name)), None)
        return [usage.get(pid)]
    return [usage.get(pid_of_rank(r, name, var)) for r in range(ranks)]


def _is_run(pid, marker):
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return marker in cmd and cmd.startswith(VITRAIN)


def one_rank_mib():
    """Device MiB of a one-rank run of the same model, while it trains."""
    name = "mem_r1"
    cmd = launch(1, "-", train_flags(name, extra="--epochs 200"))
    with open(os.path.join(WORK, name + ".log"), "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env_for(1),
                             stdin=subprocess.DEVNULL, start_new_session=True)
    mib = None
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        if len(losses(name)) >= 3:
            mib = rank_mib(1, name, "")[0]
            break
        time.sleep(0.2)
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return mib


def sigstop(check, launcher, var, mem_ref=None):
    """SIGSTOP rank 1 of a training 2-rank job; before that, with `mem_ref` (one rank's MiB),
    each rank's device memory must stay within it plus NCCL's own buffers (NCCL_MIB)."""
    name = f"stop_{launcher}"
    cmd = launch(2, launcher, train_flags(name, extra="--epochs 200"))
    log_path = os.path.join(WORK, name + ".log")
    with open(log_path, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env_for(2),
                             stdin=subprocess.DEVNULL, start_new_session=True)
    pid, t_stop = None, None
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if len(losses(name)) >= 3:  # training: the NCCL world is up and summing
            pid = pid_of_rank(1, name, var)
            if pid and mem_ref:
                per_rank = rank_mib(2, name, var)
                ok = None not in per_rank and max(per_rank) <= mem_ref + NCCL_MIB
                record(f"memory_{launcher}", ok, cmd, one_rank_mib=mem_ref,
                       two_rank_mib=per_rank, nccl_allowance_mib=NCCL_MIB)
            if pid:
                os.kill(pid, signal.SIGSTOP)
                t_stop = time.time()
                break
        time.sleep(0.2)
    rc, waited = None, None
    if t_stop:
        try:
            rc = p.wait(timeout=DIST_TIMEOUT + 90)
            waited = time.time() - t_stop
        except subprocess.TimeoutExpired:
            pass
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    if pid:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    text = open(log_path, errors="replace").read()
    named = "did not finish within" in text
    ok = bool(t_stop) and rc not in (None, 0) and waited <= DIST_TIMEOUT + 30 and named
    record(check, ok, cmd, exit_code=rc, seconds_to_exit=waited, dist_timeout=DIST_TIMEOUT,
           message=next((l[l.find("vitrain: rank"):] for l in text.splitlines()
                         if "did not finish within" in l), ""))
    if not ok:
        log(tail(name, 12))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(OUTP)
    write_toy_idx(DATA)
    probe = subprocess.run([VITRAIN, "launch-check", "--help"], capture_output=True, text=True)
    real = "usage: vitrain launch-check" in probe.stdout
    global TORCHRUN
    TORCHRUN = torchrun_cmd()
    have_torchrun = TORCHRUN is not None
    log(f"gpu_check_nccl: device {DEVICE}, dry {DRY}, vitrain {VITRAIN} "
        f"({'real' if real else 'stub: commands listed only'}), NCCL dir {NCCL_DIR or '-'}")
    if DEVICE == "cuda":
        v = nccl_version()
        log(f"NCCL the ranks load: {v}")
        # NCCL up to 2.29 refuses two ranks on one GPU ("Duplicate GPU detected").
        record("nccl_at_least_2_30", v >= 23000, ["ncclGetVersion"], nccl_version=v)
    precs = ["fp32", "bf16"] if DEVICE == "cuda" else ["fp32"]
    cases = [(m, a, p) for m in ("dp", "zero1") for a in (1, 3) for p in precs]
    plan = []
    for a in (1, 3):
        for p in precs:
            plan.append((f"r1_a{a}_{p}", 1, "-", train_flags(f"r1_a{a}_{p}", a, p)))
    for m, a, p in cases:
        extra = "--shard-optimizer" if m == "zero1" else ""
        plan.append((f"r2_{m}_a{a}_{p}", 2, "mpirun", train_flags(f"r2_{m}_a{a}_{p}", a, p, extra)))
    if not real:
        for name, ranks, launcher, args in plan:
            results.append(dict(check=name, status="SKIP", command=" ".join(launch(ranks, launcher, args))))
        return
    for name, ranks, launcher, args in plan:
        cmd = launch(ranks, launcher, args)
        rc, wall = run(name, cmd, ranks)
        log(f"ran {name}: exit {rc}, {wall:.1f} s")
        if ranks == 2:
            m, a, p = name.split("_")[1:]
            compare(f"equal_{m}_{a}_{p}", name, f"r1_{a}_{p}", FP32_TOL if p == "fp32" else BF16_TOL, cmd)
    # Resume across world sizes: stop after 7 updates, go on with the other world size.
    for first, then in ((2, 1), (1, 2)):
        name = f"resume_{first}to{then}"
        c1 = launch(first, "mpirun", train_flags(name, extra="--stop-after-updates 7"))
        c2 = launch(then, "mpirun", ["train", "--resume", os.path.join(OUTP, name)])
        rc1, _ = run(name + "_a", c1, first)
        rc2, _ = run(name + "_b", c2, then)
        if rc1 or rc2:
            record(f"resume_{first}_to_{then}", False, c1 + ["&&"] + c2, exit_codes=[rc1, rc2])
            log(tail(name + "_a") + tail(name + "_b"))
        else:
            compare(f"resume_{first}_to_{then}", name, "r1_a1_fp32", FP32_TOL, c1 + ["&&"] + c2)
    mem_ref = one_rank_mib() if DEVICE == "cuda" else None
    sigstop("sigstop_mpirun", "mpirun", "OMPI_COMM_WORLD_RANK", mem_ref)
    if not have_torchrun:
        results.append(dict(check="torchrun", status="SKIP", note="no torchrun on this machine"))
    elif DEVICE == "cuda":
        cmd = launch(2, "torchrun", train_flags("t2_dp_a1_fp32"))
        rc, _ = run("t2_dp_a1_fp32", cmd, 2)
        compare("torchrun_equal_dp_1_fp32", "t2_dp_a1_fp32", "r1_a1_fp32", FP32_TOL, cmd)
        sigstop("sigstop_torchrun", "torchrun", "RANK")
    else:
        cmd = launch(2, "torchrun", ["launch-check", "--timeout", "60"])
        rc, _ = run("t2_launch_check", cmd, 2)
        text = tail("t2_launch_check", 50)
        ok = rc == 0 and text.count("launch-check rank=") == 2 and len(
            {l.split("id=")[1].split()[0] for l in text.splitlines() if "id=" in l}) == 1
        record("torchrun_launch_check", ok, cmd, exit_code=rc)


if __name__ == "__main__":
    t0 = time.time()
    try:
        main()
    finally:
        summary = dict(issue=50, device=DEVICE, dry=DRY, seconds=round(time.time() - t0, 1),
                       passed=sum(r["status"] == "PASS" for r in results),
                       failed=sum(r["status"] == "FAIL" for r in results), checks=results)
        with open(os.path.join(DEST, "results.json"), "w") as f:
            json.dump(summary, f, indent=1)
        with open(os.path.join(DEST, "log_tail.txt"), "w") as f:
            f.write("\n".join(log_lines[-200:]) + "\n")
        print(f"gpu_check_nccl: {summary['passed']} passed, {summary['failed']} failed "
              f"({summary['seconds']} s); {DEST}/results.json")
    sys.exit(1 if any(r["status"] == "FAIL" for r in results) else 0)
