#!/usr/bin/env bash
# Builds, on THIS machine (Debian 12 with nvcc, see docs/gpu.md), everything a GPU session needs
# to check the CUDA backend on the device machine, which has the CUDA 13 driver and toolkit but
# none of our Debian libraries. Writes gpu_bundle/ (git-ignored):
#   bin/test_cuda_ops, bin/vitrain  portable x86-64 builds (no -march=native), sm_80 + sm_90
#   libs.tar.xz                     the shared libraries they load that the device image may
#                                   lack (OpenBLAS, yaml-cpp, fmt, libpng, FFTW, libgomp, the
#                                   GCC 12 C++ runtime ...); not glibc, not CUDA's own libraries
#   run.sh                          unpacks the libraries, finds the machine's libcublasLt.so.13,
#                                   prints the GPU and runs the gpu-labelled tests
# Then, in a session with a GPU, one call:  run(command="bash gpu_bundle/run.sh",
# carry=["gpu_bundle"]). The working tree plus the bundle must stay under 64 MiB.
# JOBS=N limits the build's parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu
OUT=gpu_bundle

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVIT_NATIVE=OFF -DVIT_CUDA=ON >/dev/null
if ! grep -q 'test_cuda_ops' "$BUILD/build.ninja"; then
  echo "gpu_bundle: no CUDA toolkit found (nvcc), so there are no GPU tests to bundle" >&2
  exit 1
fi
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target test_cuda_ops vitrain

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
cp "$BUILD/tests/test_cuda_ops" "$BUILD/vitrain" "$OUT/bin/"
strip "$OUT"/bin/*

# Every library ldd resolves, except glibc (ABI-bound to the loader), the vDSO and CUDA's own
# libraries (the device machine's driver and toolkit provide libcuda and libcublasLt; cudart is
# linked statically).
for bin in "$OUT"/bin/*; do ldd "$bin"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r name path; do
    case "$name" in
      linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so*) ;;
      libcuda.so* | libcublas* | libcudart*) ;;
      # The GCC 12 C++ runtime only as a fallback: the device image's is newer, and tools that
      # run under LD_LIBRARY_PATH (compute-sanitizer) may need the newer one.
      libstdc++* | libgcc_s*) mkdir -p "$OUT/lib/fallback" && cp -L "$path" "$OUT/lib/fallback/" ;;
      *) cp -L "$path" "$OUT/lib/$name" ;;
    esac
  done
strip --strip-unneeded "$OUT"/lib/*.so* "$OUT"/lib/fallback/* 2>/dev/null || true
tar -C "$OUT" -cJf "$OUT/libs.tar.xz" lib
rm -rf "$OUT/lib"

cat >"$OUT/run.sh" <<'EOF'
#!/usr/bin/env bash
# On the device machine: bash gpu_bundle/run.sh [gtest flags, e.g. --gtest_filter=*Matmul*]
# SANITIZE=1 runs the tests under compute-sanitizer (memcheck; slow). Logs go to $OUT if set.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
libs="${TMPDIR:-/tmp}/vitrain_gpu_libs"
rm -rf "$libs" && mkdir -p "$libs" && tar -C "$libs" -xJf "$here/libs.tar.xz" || exit 2
# libcublasLt.so.13: the CUDA toolkit's, else any copy on the machine (PyTorch's pip wheels).
lt=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libcublasLt.so.13" ]; then lt="$d"; break; fi
done
if [ -z "$lt" ]; then
  f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libcublasLt.so.13' -print \
      2>/dev/null | head -n 1)
  [ -n "$f" ] && lt="$(dirname "$f")"
fi
if [ -z "$lt" ]; then echo "run.sh: libcublasLt.so.13 not found on this machine" >&2; exit 2; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "libcublasLt: $lt"
export LD_LIBRARY_PATH="$libs/lib:$lt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$here/bin/test_cuda_ops" 2>&1 | grep -q 'not found'; then
  # An older system C++ runtime than the build's: use the bundled GCC 12 one.
  export LD_LIBRARY_PATH="$libs/lib/fallback:$LD_LIBRARY_PATH"
  echo "using the bundled C++ runtime"
fi
if ldd "$here/bin/test_cuda_ops" 2>&1 | grep 'not found'; then
  echo "run.sh: missing shared libraries (above)" >&2
  exit 2
fi
log="${OUT:-/tmp}"
pre=()
if [ "${SANITIZE:-0}" = 1 ]; then pre=(compute-sanitizer --tool memcheck --error-exitcode 99); fi
"${pre[@]}" "$here/bin/test_cuda_ops" --gtest_color=no \
  --gtest_output="xml:$log/test_cuda_ops.xml" "$@" 2>&1 | tee "$log/test_cuda_ops.log"
exit "${PIPESTATUS[0]}"
EOF
chmod +x "$OUT/run.sh"

echo "gpu_bundle: $(du -sh "$OUT" | cut -f1) in $OUT/ ($(du -sb "$OUT" | cut -f1) bytes)"
ls -la "$OUT" "$OUT/bin"
