// Elementwise maps for the .cu files: out[i] = f(a[i]) or f(a[i], b[i]), fp32 math on any
// storage type. Where every pointer is 16-byte aligned and n < 2^30 (always, for arena slots),
// threads move 16-byte packs (8 bf16 or 4 floats per load and store) with 32-bit indices; else
// a 64-bit scalar grid-stride loop. Both paths apply f to the same values, so their results are
// bitwise equal (test CudaOps.ElementwisePacksMatchTheScalarPath). `out` may alias an input: each
// thread reads its elements before it writes them.
#pragma once
#include <cstdint>

#include "ops/cuda/common.cuh"

namespace vit::cuda {

template <typename T>
constexpr int kPack = 16 / int(sizeof(T));  // elements per 16-byte pack

template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
constexpr Index kPackedMaxN = Index(1) << 30;  // 32-bit indices stay far from overflow

template <typename T, typename F>
__global__ void map1_packed_kernel(T* out, const T* a, int npack, int n, F f) {
  // out, a (n): packs [0, npack), then the tail [npack * kPack, n), one element per thread
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  for (int p = tid; p < npack; p += gridDim.x * blockDim.x) {
    const Pack<T> x = reinterpret_cast<const Pack<T>*>(a)[p];
    Pack<T> y;
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) y.v[k] = from_f32<T>(f(to_f32(x.v[k])));
    reinterpret_cast<Pack<T>*>(out)[p] = y;
  }
  const int i = npack * kPack<T> + tid;
  if (i < n) out[i] = from_f32<T>(f(to_f32(a[i])));
}

template <typename T, typename F>
__global__ void map2_packed_kernel(T* out, const T* a, const T* b, int npack, int n, F f) {
  // out, a, b (n): as map1_packed_kernel
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  for (int p = tid; p < npack; p += gridDim.x * blockDim.x) {
    const Pack<T> x = reinterpret_cast<const Pack<T>*>(a)[p];
    const Pack<T> z = reinterpret_cast<const Pack<T>*>(b)[p];
    Pack<T> y;
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) y.v[k] = from_f32<T>(f(to_f32(x.v[k]), to_f32(z.v[k])));
    reinterpret_cast<Pack<T>*>(out)[p] = y;
  }
  const int i = npack * kPack<T> + tid;
  if (i < n) out[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i])));
}

template <typename T, typename F>
__global__ void map1_scalar_kernel(T* out, const T* a, Index n, F f) {
  // out, a (n)
  VIT_GRID_STRIDE(i, n) out[i] = from_f32<T>(f(to_f32(a[i])));
}

template <typename T, typename F>
__global__ void map2_scalar_kernel(T* out, const T* a, const T* b, Index n, F f) {
  // out, a, b (n)
  VIT_GRID_STRIDE(i, n) out[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i])));
}

// out (n) = f(a) elementwise, on stream().
template <typename T, typename F>
void map1(T* out, const T* a, Index n, F f) {
  if (n <= 0) return;
  if (n < kPackedMaxN && aligned16(out) && aligned16(a)) {
    const Index npack = n / kPack<T>;
    map1_packed_kernel<<<grid_stride_blocks(npack > 0 ? npack : 1), kBlock, 0, stream()>>>(
        out, a, int(npack), int(n), f);
  } else {
    map1_scalar_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, a, n, f);
  }
  VIT_CUDA_LAUNCHED();
}

// out (n) = f(a, b) elementwise, on stream().
template <typename T, typename F>
void map2(T* out, const T* a, const T* b, Index n, F f) {
  if (n <= 0) return;
  if (n < kPackedMaxN && aligned16(out) && aligned16(a) && aligned16(b)) {
    const Index npack = n / kPack<T>;
    map2_packed_kernel<<<grid_stride_blocks(npack > 0 ? npack : 1), kBlock, 0, stream()>>>(
        out, a, b, int(npack), int(n), f);
  } else {
    map2_scalar_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, a, b, n, f);
  }
  VIT_CUDA_LAUNCHED();
}

}  // namespace vit::cuda
