#!/usr/bin/env bash
# The real launchers start `vitrain launch-check` (no GPU, no data) and every rank's line must
# be right: ranks 0..N-1 once each, world size N, the launcher's name, the same id hash on every
# rank, and an exchange that is not on MASTER_PORT (torchrun's agent store holds that).
#   launch_check.sh VITRAIN torchrun N    (torchrun --no_python --nproc_per_node N)
#   launch_check.sh VITRAIN mpirun N
# Exit 0 when all is right; 77 (skipped) when the launcher is not installed.
set -euo pipefail
vitrain=$1 launcher=$2 n=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

case $launcher in
  torchrun)
    command -v torchrun >/dev/null || { echo "SKIP: no torchrun"; exit 77; }
    port=$(free_port)
    # Underscore spellings: torch 1.13 (Debian's) knows no others, later ones take both.
    # --redirects 1 --tee 1: stdout to the console through the agent; Debian's torch 1.13 under
    # Python 3.11 cannot parse the default "0" (its Std enum lost the zero member).
    timeout 120 torchrun --no_python --nnodes 1 --nproc_per_node "$n" --master_addr 127.0.0.1 \
      --master_port "$port" --redirects 1 --tee 1 --log_dir "$out/logs" \
      "$vitrain" launch-check --timeout 60 >"$out/stdout" 2>"$out/stderr" || rc=$?
    want=torchrun
    ;;
  mpirun)
    command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
    # Under scripts/sanitize.sh: Open MPI's own allocations at exit are not ours to report.
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$n" \
      ${ASAN_OPTIONS:+-x ASAN_OPTIONS=detect_leaks=0} "$vitrain" launch-check --timeout 60 >"$out/stdout" 2>"$out/stderr" || rc=$?
    want=mpirun
    port=0
    ;;
  *)
    echo "usage: $0 VITRAIN torchrun|mpirun N" >&2
    exit 2
    ;;
esac

echo "== $launcher -np $n: exit ${rc:-0}"
cat "$out/stdout"
python3 - "$out/stdout" "$n" "$want" "$port" "${rc:-0}" "$out/stderr" <<'PY'
import re, sys
path, n, want, port, rc, err = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
bad = []
if rc != 0:
    bad.append(f"the launcher exited {rc}: " + open(err).read()[-2000:])
views = []
for line in open(path):
    m = re.search(r"launch-check (.*)$", line.strip())  # torchrun's tee prefixes "[default0]:"
    if m:
        views.append(dict(kv.split("=", 1) for kv in m.group(1).split()))
ranks = sorted(int(v["rank"]) for v in views)
if ranks != list(range(n)):
    bad.append(f"ranks {ranks}, want 0..{n - 1} once each")
for v in views:
    r = v["rank"]
    if int(v["size"]) != n: bad.append(f"rank {r}: size {v['size']}, want {n}")
    if v["launcher"] != want: bad.append(f"rank {r}: launcher {v['launcher']}, want {want}")
    if int(v["id_bytes"]) != 128: bad.append(f"rank {r}: id of {v['id_bytes']} bytes")
    if want == "torchrun":
        if int(v["local_rank"]) != int(r): bad.append(f"rank {r}: local rank {v['local_rank']}")
        if int(v["master_port"]) != port: bad.append(f"rank {r}: MASTER_PORT {v['master_port']}, want {port}")
        if v["via"] != f"tcp:127.0.0.1:{port + 1}": bad.append(f"rank {r}: via {v['via']}, want tcp:127.0.0.1:{port + 1}")
    else:
        if v["via"] != "mpi": bad.append(f"rank {r}: via {v['via']}, want mpi")
ids = {v["id"] for v in views}
if len(ids) != 1:
    bad.append(f"the ranks saw {len(ids)} different ids: {sorted(ids)}")
for b in bad:
    print("FAIL:", b)
print("PASS" if not bad else f"{len(bad)} problem(s)")
sys.exit(1 if bad else 0)
PY
