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

// G values of T loaded and stored as whole 16-byte packs: one pack by default; more where a
// wider type keeps step with a narrower one (8 floats beside a pack of 8 bf16: two packs).
template <typename T, int G = kPack<T>>
struct alignas(16) Pack {
  T v[G];
};

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

// The end of a packed column-sum block (32, 8): each thread's per-column sums acc (P columns
// of its pack), then the 8 y-sums of each column in order (a fixed order: deterministic) into
// partial[blockIdx.y, c] (chunks, C).
template <int P>
__device__ void store_chunk_column_sums(float* partial, const float (&acc)[P], int C) {
  __shared__ float sm[8][32 * P + 1];
#pragma unroll
  for (int j = 0; j < P; ++j) sm[threadIdx.y][threadIdx.x * P + j] = acc[j];
  __syncthreads();
  for (int k = threadIdx.y * 32 + threadIdx.x; k < 32 * P; k += 256) {
    const int c = blockIdx.x * 32 * P + k;
    if (c >= C) break;
    float s = 0.0f;
    for (int y = 0; y < 8; ++y) s += sm[y][k];
    partial[size_t(blockIdx.y) * C + c] = s;
  }
}

template <typename T>
__global__ void colsum_packed_partial_kernel(float* partial, const T* d, int R, int C,
                                             int rows_per_chunk) {
  // d (R, C) -> partial (chunks, C). Block (32, 8): x walks packs of columns, y interleaves the
  // chunk's rows, then the 8 y-sums in order (a fixed order: deterministic).
  constexpr int P = kPack<T>;
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * P;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
  float acc[P] = {};
  if (c0 < C)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const Pack<T> v = *reinterpret_cast<const Pack<T>*>(d + size_t(r) * C + c0);
#pragma unroll
      for (int j = 0; j < P; ++j) acc[j] += to_f32(v.v[j]);
    }
  store_chunk_column_sums<P>(partial, acc, C);
}

// The backward of an activation with the column sums of its result folded in (the bias
// gradient of the Linear before it): dinp = from_f32(f(dout, x)) is stored and its fp32 value
// summed in colsum_packed_partial_kernel's chunks and order, so dinp and the sums have the bits
// of map2 followed by colsum_rows_accumulate, and dinp is not read back.
template <typename T, typename F>
__global__ void map2_colsum_packed_kernel(T* dinp, float* partial, const T* dout, const T* x, int R,
                                          int C, int rows_per_chunk, F f) {
  // dinp, dout, x (R, C); partial (chunks, C). Block (32, 8) as colsum_packed_partial_kernel.
  constexpr int P = kPack<T>;
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * P;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
  float acc[P] = {};
  if (c0 < C)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const size_t at = size_t(r) * C + c0;
      const Pack<T> g = *reinterpret_cast<const Pack<T>*>(dout + at);
      const Pack<T> v = *reinterpret_cast<const Pack<T>*>(x + at);
      Pack<T> y;
#pragma unroll
      for (int j = 0; j < P; ++j) {
        y.v[j] = from_f32<T>(f(to_f32(g.v[j]), to_f32(v.v[j])));
        // __fadd_rn: for T = float, y is f's last product, and a plain add lets ptxas fuse
        // it into an FMA with the unrounded product (not the stored dinp's bits).
        acc[j] = __fadd_rn(acc[j], to_f32(y.v[j]));
      }
      *reinterpret_cast<Pack<T>*>(dinp + at) = y;
    }
  store_chunk_column_sums<P>(partial, acc, C);
}

template <typename T>
struct MatrixValue {  // f(r, c) = d[r, c] of a (R, C) buffer
  const T* d;
  Index C;
  __device__ float operator()(Index r, Index c) const { return to_f32(d[r * C + c]); }
};

// A packed column sum of (R, C) into out (C): blocks (32, 8) of 32 packs of columns (a thread
// covers a pack) by row chunks from colsum_chunks (enough to fill the GPU); launch(grid,
// partial, rows_per_chunk) enqueues the kernel that fills partial (chunks, C) in scratch, then
// out += the partials summed in chunk order.
template <typename T, typename Launch>
void packed_colsum(float* out, Index R, Index C, Launch&& launch) {
  const Index col_blocks = (C / kPack<T> + 31) / 32;
  const auto [chunks, rows_per_chunk] = colsum_chunks(R, col_blocks);
  auto* partial = static_cast<float*>(scratch(size_t(chunks * C) * sizeof(float), kScratchColsum));
  launch(dim3(unsigned(col_blocks), unsigned(chunks)), partial, int(rows_per_chunk));
  VIT_CUDA_LAUNCHED();
  colsum_finish_kernel<float><<<blocks_for(C), kBlock, 0, stream()>>>(out, partial, chunks, C);
  VIT_CUDA_LAUNCHED();
}

// out (C) += column sums of d (R, C): 16-byte packs where C is a multiple of the pack and d is
// aligned, else colsum_accumulate. Deterministic either way; the two sum in different orders.
template <typename T>
void colsum_rows_accumulate(float* out, const T* d, Index R, Index C) {
  if (R <= 0 || C <= 0) return;
  if (R * C >= kPackedMaxN || C % kPack<T> != 0 || !aligned16(d)) {
    colsum_accumulate(out, MatrixValue<T>{d, C}, R, C);
    return;
  }
  packed_colsum<T>(out, R, C, [&](dim3 grid, float* partial, int rows_per_chunk) {
    colsum_packed_partial_kernel<T>
        <<<grid, dim3(32, 8), 0, stream()>>>(partial, d, int(R), int(C), rows_per_chunk);
  });
}

// dinp (R, C) = f(dout, x) elementwise; dbias (C) += its column sums (none if null). One pass on
// packs where C is a multiple of the pack and the pointers are aligned, else map2 then
// colsum_rows_accumulate: the same bits either way.
template <typename T, typename F>
void map2_colsum(T* dinp, float* dbias, const T* dout, const T* x, Index R, Index C, F f) {
  if (R <= 0 || C <= 0) return;
  if (!dbias || R * C >= kPackedMaxN || C % kPack<T> != 0 || !aligned16(dinp) || !aligned16(dout) ||
      !aligned16(x)) {
    map2(dinp, dout, x, R * C, f);
    if (dbias) colsum_rows_accumulate(dbias, static_cast<const T*>(dinp), R, C);
    return;
  }
  packed_colsum<T>(dbias, R, C, [&](dim3 grid, float* partial, int rows_per_chunk) {
    map2_colsum_packed_kernel<T><<<grid, dim3(32, 8), 0, stream()>>>(dinp, partial, dout, x, int(R),
                                                                     int(C), rows_per_chunk, f);
  });
}

}  // namespace vit::cuda
