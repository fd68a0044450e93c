#!/usr/bin/env bash
# Builds, on THIS machine (Debian 12 with nvcc, see docs/gpu.md), everything a GPU session needs
# to check the CUDA backend on the device machine, which has the CUDA 13 driver and toolkit,
# PyTorch and timm, but none of our Debian libraries and no network. Writes gpu_bundle/
# (git-ignored):
#   bin.tar.xz          bin/vitrain and every GPU test binary the build has (bin/test_cuda_*;
#                       test_cuda_ops at least), packed; env.sh unpacks bin/ on the device
#                       portable x86-64 builds (no -march=native), sm_80 + sm_90
#   libs.tar.xz         the shared libraries they load that the device image may lack (OpenBLAS,
#                       yaml-cpp, fmt, libpng, FFTW, libgomp, the GCC 12 C++ runtime ...); not
#                       glibc, not CUDA's own libraries
#   data/fashion-mnist  the four IDX .gz files (the device machine cannot download them)
#   recipes/, py/       the recipes and the Python scripts gpu_check.sh runs (timm_bench.py,
#                       timm_load_check.py, torch_fmnist_loop.py and
#                       what it imports; copies: the working tree travels too, and gpu_check.sh
#                       prefers the tree's own files)
#   nccl/               NCCL 2.30.7 for sm_90 (../shared/nccl, NCCL_XZ): the two-rank NCCL
#                       check's library (issue 50); env.sh unpacks it and sets VIT_NCCL_DIR
#   env.sh              sourced: unpacks the libraries, finds the machine's libcublasLt.so.13 and
#                       sets VIT_LD_LIBRARY_PATH for our binaries only (PyTorch keeps its own)
#   run.sh              the op harness alone: bash gpu_bundle/run.sh [gtest flags]
#   gpu_check.sh        a copy of scripts/gpu_check.sh, the whole one-call check (and its report,
#                       gpu_check_report.py, and the kernel-plan variants, gpu_presets.tsv)
#   MANIFEST.txt        commit, local changes, build and sizes, to tie results to sources
# Then, in a session with a GPU (docs/gpu.md):
#   run(command="bash scripts/gpu_check.sh session", carry=["gpu_bundle"], timeout_s=600)
# The working tree plus the bundle must stay under 64 MiB (checked at the end).
# JOBS=N limits the build's parallelism (default: all cores). SKIP_BUILD=1 packs what build-gpu/
# already holds. FMNIST_DIR overrides /usr/share/datasets/fashion-mnist, NCCL_XZ
# ../shared/nccl/libnccl.so.2.xz.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu
OUT=gpu_bundle
FMNIST_DIR="${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"
NCCL_XZ="${NCCL_XZ:-../shared/nccl/libnccl.so.2.xz}"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # No MPI: the device image has no OpenMPI libraries, and data parallel on the GPU waits for
  # NCCL anyway.
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVIT_NATIVE=OFF -DVIT_CUDA=ON \
    -DVIT_MPI=OFF >/dev/null
  if ! grep -q 'test_cuda_ops' "$BUILD/build.ninja"; then
    echo "gpu_bundle: no CUDA toolkit found (nvcc), so there are no GPU tests to bundle" >&2
    exit 1
  fi
  cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target test_cuda_ops vitrain
  # The other GPU tests, whichever the build has, are optional: a bundle without them checks
  # the rest. The target list is read whole first: `ninja ... | grep -q` under pipefail fails
  # once grep quits early and ninja dies of SIGPIPE (the list outgrew the pipe).
  targets=$(ninja -C "$BUILD" -t targets all 2>/dev/null)
  mapfile -t gpu_tests < <(grep -oE '^(tests/)?test_cuda_[a-z0-9_]+:' <<<"$targets" |
    sed 's/^tests\///; s/:$//' | sort -u)
  for t in "${gpu_tests[@]}"; do
    [ "$t" = test_cuda_ops ] && continue
    cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "$t" ||
      echo "gpu_bundle: WARNING: $t failed to build; bundling without it" >&2
  done
fi

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in vitrain tests/test_cuda_ops; do
  [ -x "$BUILD/$b" ] || { echo "gpu_bundle: $BUILD/$b is missing" >&2 && exit 1; }
done
cp "$BUILD/vitrain" "$OUT/bin/"
for b in "$BUILD"/tests/test_cuda_*; do # the binaries, not gtest's discovery files beside them
  [[ -f "$b" && -x "$b" && "$(basename "$b")" =~ ^test_cuda_[a-z0-9_]+$ ]] && cp "$b" "$OUT/bin/"
done
strip "$OUT"/bin/*
if ! ldd "$OUT/bin/vitrain" | grep -q libcublasLt; then
  echo "gpu_bundle: WARNING: bin/vitrain does not link libcublasLt, so it has no CUDA backend:" \
    "its --device cuda steps will fail" >&2
fi

# Every library ldd resolves, except glibc (ABI-bound to the loader), the vDSO and CUDA's own
# libraries (the device machine's driver and toolkit provide libcuda, libcublasLt and libnccl,
# 200+ MB each; cudart is linked statically; NVML is dlopen'ed from the driver).
for bin in "$OUT"/bin/*; do ldd "$bin"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r name path; do
    case "$name" in
      linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so*) ;;
      libcuda.so* | libcublas* | libcudart* | libnvidia-ml* | libnccl*) ;;
      # The GCC 12 C++ runtime only as a fallback: the device image's is newer, and tools that
      # run under LD_LIBRARY_PATH (compute-sanitizer) may need the newer one.
      libstdc++* | libgcc_s*) mkdir -p "$OUT/lib/fallback" && cp -L "$path" "$OUT/lib/fallback/" ;;
      *) cp -L "$path" "$OUT/lib/$name" ;;
    esac
  done
strip --strip-unneeded "$OUT"/lib/*.so* "$OUT"/lib/fallback/* 2>/dev/null || true
tar -C "$OUT" -cJf "$OUT/libs.tar.xz" lib
rm -rf "${OUT:?}/lib"
# The binaries each link the whole engine statically (41 MB for the six, 2026-11-25): packed
# they are 7 MB, and env.sh unpacks them on the device.
# Every test name gpu_check.sh's filters give must be in these binaries (gtest passes an empty
# selection silently; a bundle built before a rename would check nothing).
bash tests/gpu_check_filters.sh scripts/gpu_check.sh "$OUT"/bin/test_cuda_* || {
  echo "gpu_bundle: scripts/gpu_check.sh names tests these binaries lack (above)" >&2
  exit 1
}
# xz -9: its 64 MiB dictionary reaches back over whole binaries, which share most of their
# code (the engine each links): 22.2 MB at the default level (8 MiB) against 7.0 MB for the
# eight binaries of a build of 2026-11-28 (2 min 47 s instead of 1 min 16 s on 2 cores; the
# device unpacks it with 65 MiB of memory). Single-threaded: xz -T splits the input into blocks
# that cannot match each other.
XZ_OPT=-9 tar -C "$OUT" -cJf "$OUT/bin.tar.xz" bin
rm -rf "${OUT:?}/bin"

# Data, recipes and scripts: the device machine has no network and none of our Debian packages.
mkdir -p "$OUT/data/fashion-mnist" "$OUT/recipes" "$OUT/py"
n_idx=0
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
  t10k-labels-idx1-ubyte; do
  for p in "$FMNIST_DIR/$f.gz" "$FMNIST_DIR/$f"; do
    if [ -f "$p" ]; then cp -L "$p" "$OUT/data/fashion-mnist/" && n_idx=$((n_idx + 1)) && break; fi
  done
done
[ "$n_idx" = 4 ] || echo "gpu_bundle: WARNING: only $n_idx of the 4 Fashion-MNIST files in" \
  "$FMNIST_DIR (apt-get install dataset-fashion-mnist); the training steps will fail" >&2
cp recipes/*.yaml "$OUT/recipes/"
cp bench/timm_bench.py bench/torch_train_bench.py bench/timm_load_check.py bench/torch_fmnist_loop.py \
  tests/reference/torch_vit.py tests/reference/timm_logits_check.py "$OUT/py/"
cp scripts/gpu_check.sh scripts/gpu_check_report.py scripts/gpu_presets.tsv "$OUT/"
if [ -f "$NCCL_XZ" ]; then
  mkdir -p "$OUT/nccl" && cp "$NCCL_XZ" "$OUT/nccl/libnccl.so.2.xz"
  cp "$(dirname "$NCCL_XZ")/README.md" "$OUT/nccl/" 2>/dev/null || true
else
  echo "gpu_bundle: WARNING: no $NCCL_XZ; the two-rank NCCL check will lack NCCL 2.30" >&2
fi

cat >"$OUT/env.sh" <<'EOF'
# Sourced by run.sh and scripts/gpu_check.sh on the device machine (bash). Unpacks the bundled
# libraries, finds the machine's libcublasLt.so.13 and libnccl.so.2 and sets, exported:
#   VIT_BUNDLE           this folder
#   VIT_LD_LIBRARY_PATH  what our binaries need in LD_LIBRARY_PATH; only for them: PyTorch must
#                        keep its own (newer) libraries
#   VIT_CUBLASLT_DIR     where libcublasLt.so.13 was found ("" if nowhere)
#   VIT_NCCL_DIR         the folder of the bundled NCCL 2.30 libnccl.so.2 ("" if none): for the
#                        two-rank check only, which puts it first in its LD_LIBRARY_PATH
# Returns 2, with a message, when a bundled binary would not start.
# The folder holding library $1: the CUDA toolkit's, else any copy on the machine (PyTorch's
# pip wheels); "" if none.
vit_find_lib() {
  local d f
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    if [ -e "$d/$1" ]; then echo "$d"; return; fi
  done
  f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$1" -print 2>/dev/null |
      head -n 1)
  [ -n "$f" ] && dirname "$f"
}
vit_bundle_env() {
  VIT_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  local libs="${TMPDIR:-/tmp}/vitrain_gpu_libs" lt="" nccl="" b missing
  if ! { rm -rf "$libs" && mkdir -p "$libs" && tar -C "$libs" -xJf "$VIT_BUNDLE/libs.tar.xz"; }; then
    echo "env.sh: cannot unpack $VIT_BUNDLE/libs.tar.xz" >&2
    return 2
  fi
  # bin/ from bin.tar.xz (packed to fit the device tool's 64 MiB), unpacked outside the bundle
  # and linked in as bin: a dry run here then leaves only a link in gpu_bundle/ (41 MB of
  # binaries would not travel), and a newer bin.tar.xz is unpacked again, never run stale.
  local bins="${TMPDIR:-/tmp}/vitrain_gpu_bin"
  if [ ! -f "$VIT_BUNDLE/bin/.unpacked" ] || [ "$VIT_BUNDLE/bin.tar.xz" -nt "$VIT_BUNDLE/bin/.unpacked" ]; then
    if ! { rm -rf "$bins" "${VIT_BUNDLE:?}/bin" && mkdir -p "$bins" &&
      tar -C "$bins" -xJf "$VIT_BUNDLE/bin.tar.xz" && touch "$bins/bin/.unpacked" &&
      ln -s "$bins/bin" "$VIT_BUNDLE/bin"; }; then
      echo "env.sh: cannot unpack $VIT_BUNDLE/bin.tar.xz" >&2
      return 2
    fi
  fi
  lt=$(vit_find_lib libcublasLt.so.13)
  nccl=$(vit_find_lib libnccl.so.2)
  VIT_CUBLASLT_DIR="$lt"
  VIT_LD_LIBRARY_PATH="$libs/lib${lt:+:$lt}"
  [ -n "$nccl" ] && [ "$nccl" != "$lt" ] && VIT_LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH:$nccl"
  VIT_LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing=""
  for b in "$VIT_BUNDLE"/bin/*; do
    LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH" ldd "$b" 2>&1 | grep -q 'not found' && missing=1
  done
  if [ -n "$missing" ]; then
    # An older system C++ runtime than the build's: use the bundled GCC 12 one.
    VIT_LD_LIBRARY_PATH="$libs/lib/fallback:$VIT_LD_LIBRARY_PATH"
    echo "env.sh: using the bundled C++ runtime"
  fi
  VIT_NCCL_DIR=""
  if [ -f "$VIT_BUNDLE/nccl/libnccl.so.2.xz" ]; then
    local nd="${TMPDIR:-/tmp}/vitrain_gpu_nccl"
    mkdir -p "$nd" && xz -dc "$VIT_BUNDLE/nccl/libnccl.so.2.xz" >"$nd/libnccl.so.2" &&
      VIT_NCCL_DIR="$nd"
    # The unpacked file's sha256 as ../shared/nccl/README.md states it.
    sha256sum "$nd/libnccl.so.2" 2>/dev/null | grep -q '^d16080ad9b0a9334' ||
      echo "env.sh: WARNING: the bundled libnccl.so.2's sha256 is not NCCL 2.30.7's" >&2
  fi
  export VIT_BUNDLE VIT_LD_LIBRARY_PATH VIT_CUBLASLT_DIR VIT_NCCL_DIR
  echo "env.sh: libcublasLt: ${lt:-NOT FOUND}; libnccl: ${nccl:-NOT FOUND}; NCCL 2.30: ${VIT_NCCL_DIR:-NOT BUNDLED}"
  for b in "$VIT_BUNDLE"/bin/*; do
    if LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH" ldd "$b" 2>&1 | grep 'not found'; then
      echo "env.sh: $(basename "$b") misses the shared libraries above" >&2
      return 2
    fi
  done
  return 0
}
vit_bundle_env
EOF

cat >"$OUT/run.sh" <<'EOF'
#!/usr/bin/env bash
# On the device machine: bash gpu_bundle/run.sh [gtest flags, e.g. --gtest_filter=*Matmul*]
# The op harness alone (scripts/gpu_check.sh runs everything). SANITIZE=1 runs it under
# compute-sanitizer (memcheck; slow). VIT_REQUIRE_GPU=1 is set: no device fails, never skips.
# Logs go to $OUT if set.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=/dev/null
source "$here/env.sh" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export LD_LIBRARY_PATH="$VIT_LD_LIBRARY_PATH" VIT_REQUIRE_GPU=1
log="${OUT:-/tmp}"
pre=()
if [ "${SANITIZE:-0}" = 1 ]; then pre=(compute-sanitizer --tool memcheck --error-exitcode 99); fi
"${pre[@]}" "$here/bin/test_cuda_ops" --gtest_color=no \
  --gtest_output="xml:$log/test_cuda_ops.xml" "$@" 2>&1 | tee "$log/test_cuda_ops.log"
exit "${PIPESTATUS[0]}"
EOF
chmod +x "$OUT/run.sh" "$OUT/gpu_check.sh"

# What was built from what: results that come back name this.
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  if git rev-parse --git-dir >/dev/null 2>&1; then
    echo "commit: $(git rev-parse HEAD) ($(git log -1 --format=%s | cut -c1-80))"
    # GIT_OPTIONAL_LOCKS=0: status must not rewrite the index (others work in this checkout).
    echo "local changes (git status --porcelain):"
    GIT_OPTIONAL_LOCKS=0 git status --porcelain | sed 's/^/  /'
  else
    echo "commit: (not a git checkout)"
  fi
  echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | tail -n 1)"
  echo "cuda code: $(grep -o -- '--generate-code=[^ ]*' "$BUILD/build.ninja" | sort -u | tr '\n' ' ')"
  echo "files:"
  (cd "$OUT" && find . -type f ! -name MANIFEST.txt | sort | while read -r f; do
    printf '  %-40s %10s  %s\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)"
  done)
} >"$OUT/MANIFEST.txt"

# The device tool sends the working tree (tracked + untracked-not-ignored files, shared/) plus
# the carried bundle: 64 MiB in all.
tree_bytes=$({ git ls-files -z -co --exclude-standard 2>/dev/null || true; } |
  xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
[ -d shared ] && tree_bytes=$((tree_bytes + $(du -sb shared | cut -f1)))
bundle_bytes=$(du -sb "$OUT" | cut -f1)
total=$((tree_bytes + bundle_bytes))
echo "gpu_bundle: $(du -sh "$OUT" | cut -f1) in $OUT/ ($bundle_bytes bytes); with the working" \
  "tree ($tree_bytes bytes) $((total / 1048576)) MiB of the device tool's 64 MiB"
ls -la "$OUT"
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "gpu_bundle: ERROR: over 64 MiB: the device tool would refuse this" >&2
  exit 1
elif [ "$total" -gt $((60 * 1048576)) ]; then
  echo "gpu_bundle: WARNING: within 4 MiB of the 64 MiB limit" >&2
fi
