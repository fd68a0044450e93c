// The depthwise 3x3 kernels (dwconv.cu launches them): plain CUDA C++ with no intrinsics beyond
// to_f32/from_f32, __fmaf_rn, shared memory and __syncthreads, so that tests/cuda_host_sim.h
// can also compile them for the CPU and run them with one host thread per CUDA thread
// (tests/test_kernels_on_host.cpp): their indexing and rounding are checked in CI, where
// no GPU is. Under that simulation VIT_CUDA_HOST_SIM is defined and the shim provides what
// common.cuh would.
#pragma once
#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#endif

namespace vit::cuda::dwconv_kernels {

// One (b, x, c) column of a (B, N, C) tensor whose rows after `prefix` are the (gh, gw) grid:
// element (y, x') of the column's image and channel sits at at(y, x'). With kVec channels a
// thread (VIT_DWCONV_VEC), column i is the (b, x) column of channels c .. c + kVec - 1.
struct Column {
  int b, x, c, gh, gw;
  Index base;  // (b, prefix, c)
  Index C;
  __device__ Column(int i, int N, int prefix, int gh_, int gw_, int C_, int vec = 1)
      : gh(gh_), gw(gw_), C(C_) {
    const int groups = C_ / vec;
    c = i % groups * vec;
    const int bx = i / groups;
    x = bx % gw_;
    b = bx / gw_;
    base = (Index(b) * N + prefix) * C_ + c;
  }
  __device__ Index at(int y, int xx) const { return base + Index(y * gw + xx) * C; }
  __device__ bool row_in(int y) const { return y >= 0 && y < gh; }
};

// kVec neighbouring channels of a stored tensor, moved as one access (element j must then be
// kVec-aligned: the launcher checks the pointers and C).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Lanes {
  T v[kVec];
};
template <int kVec, typename T>
__device__ __forceinline__ Lanes<T, kVec> load_lanes(const T* p, Index j) {
  return *reinterpret_cast<const Lanes<T, kVec>*>(p + j);
}
template <int kVec, typename T>
__device__ __forceinline__ void store_lanes(T* p, Index j, const float (&x)[kVec]) {
  Lanes<T, kVec> l;
#pragma unroll
  for (int v = 0; v < kVec; ++v) l.v[v] = from_f32<T>(x[v]);
  *reinterpret_cast<Lanes<T, kVec>*>(p + j) = l;
}

// The window row y of a column: f(j, values) at (y, x - 1), (y, x), (y, x + 1), 0 outside the
// grid; each of the kVec channels its own window.
template <int kVec, typename F>
__device__ __forceinline__ void window_row(float (&v)[3][kVec], const Column& q, int y, F f) {
#pragma unroll
  for (int k = 0; k < 3; ++k)
#pragma unroll
    for (int l = 0; l < kVec; ++l) v[k][l] = 0.0f;
  if (!q.row_in(y)) return;
  if (q.x > 0) f(q.at(y, q.x - 1), v[0]);
  f(q.at(y, q.x), v[1]);
  if (q.x + 1 < q.gw) f(q.at(y, q.x + 1), v[2]);
}

// The 3x3 taps of channels c .. c + kVec - 1 of weight (C, 1, 3, 3): w[tap][channel].
template <int kVec, typename T>
__device__ __forceinline__ void load_taps(float (&w)[9][kVec], const T* weight, int c) {
#pragma unroll
  for (int k = 0; k < 9; ++k)
#pragma unroll
    for (int l = 0; l < kVec; ++l) w[k][l] = to_f32(weight[(c + l) * 9 + k]);
}

// Shifts a column's window one row down: up <- mid <- down.
template <int kVec>
__device__ __forceinline__ void shift_rows(float (&up)[3][kVec], float (&mid)[3][kVec],
                                           const float (&down)[3][kVec]) {
#pragma unroll
  for (int k = 0; k < 3; ++k)
#pragma unroll
    for (int l = 0; l < kVec; ++l) up[k][l] = mid[k][l], mid[k][l] = down[k][l];
}

// The k-th element of the prefix rows, (b, p, c) with p < prefix, in (B, N, C).
__device__ __forceinline__ Index prefix_element(int k, int N, int prefix, int C) {
  const int c = k % C, bp = k / C;
  return (Index(bp / prefix) * N + bp % prefix) * C + c;
}

template <typename T, int kVec = 1>
__global__ void dwconv3x3_forward_kernel(T* out, const T* inp, const T* weight, int columns,
                                         int prefix_total, int N, int prefix, int gh, int gw,
                                         int C) {
  // inp, out (B, N, C), grid rows after `prefix`; weight (C, 1, 3, 3). Threads [0, columns): a
  // (b, x) column of kVec channels each; then one per prefix element (out = 0: the class token
  // bypasses the conv). Each channel's sums are those of kVec = 1, in the same order.
  VIT_GRID_STRIDE(t, Index(columns) + prefix_total) {
    if (t >= columns) {
      out[prefix_element(int(t - columns), N, prefix, C)] = from_f32<T>(0.0f);
      continue;
    }
    const Column q(int(t), N, prefix, gh, gw, C, kVec);
    float w[9][kVec];
    load_taps(w, weight, q.c);
    const auto load = [&](Index j, float(&x)[kVec]) {
      const Lanes<T, kVec> in = load_lanes<kVec>(inp, j);
#pragma unroll
      for (int l = 0; l < kVec; ++l) x[l] = to_f32(in.v[l]);
    };
    float up[3][kVec], mid[3][kVec], down[3][kVec];  // rows y - 1, y, y + 1
    window_row(up, q, -1, load);                     // zeros
    window_row(mid, q, 0, load);
    for (int y = 0; y < gh; ++y) {
      window_row(down, q, y + 1, load);
      float acc[kVec];
#pragma unroll
      for (int l = 0; l < kVec; ++l) {
        acc[l] = 0.0f;
#pragma unroll
        for (int k = 0; k < 9; ++k) {  // tap (dy, dx) reads row dy + 1 of (up, mid, down)
          const float(&row)[3][kVec] = k / 3 == 0 ? up : k / 3 == 1 ? mid : down;
          acc[l] = __fmaf_rn(w[k][l], row[k % 3][l], acc[l]);
        }
      }
      store_lanes(out, q.at(y, q.x), acc);
      shift_rows(up, mid, down);
    }
  }
}

template <typename T>
__global__ void dwconv3x3_backward_prefix_kernel(T* dinp, int prefix_total, int N, int prefix,
                                                 int C) {
  // dinp (B, N, C): the prefix (class-token) rows, which bypass the conv, get the gradient of
  // a zero sum.
  VIT_GRID_STRIDE(t, prefix_total) {
    dinp[prefix_element(int(t), N, prefix, C)] = from_f32<T>(0.0f);
  }
}

constexpr int kRows = 8;  // block (32 channel lanes, kRows column lanes)

// 4 blocks of 256 threads per SM at one channel a thread: at most 64 registers (ptxas chose 66
// unbounded); 2 at two channels.
template <typename T, int kVec = 1>
__global__ void __launch_bounds__(32 * kRows, kVec == 1 ? 4 : 2)
    dwconv3x3_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* weight,
                              int B, int N, int prefix, int gh, int gw, int C, int cols_per_chunk) {
  // dinp, dout, inp (B, N, C) grid rows; partial (chunks, 9, C) or nullptr. Block (32 lanes of
  // kVec channels, kRows lanes), grid (channel blocks, chunks of (b, x) columns): each lane
  // walks its columns down with two 3x3 windows in registers, the output gradient's and the
  // input's, and in one pass forms
  //  * dinp (unless nullptr), gather form: input (y, x) fed output (y - dy, x - dx) via tap
  //    (dy, dx);
  //  * the weight gradient's partial sums over the chunk: dout[pixel] * inp[pixel + tap].
  // Each channel's sums are those of kVec = 1 (the same columns a lane, in the same order).
  __shared__ float sm[kRows][9][32 * kVec + 1];
  const int c = (blockIdx.x * 32 + threadIdx.x) * kVec;
  const int u0 = blockIdx.y * cols_per_chunk;
  const int u1 = min(u0 + cols_per_chunk, B * gw);
  float acc[9][kVec];
#pragma unroll
  for (int t = 0; t < 9; ++t)
#pragma unroll
    for (int l = 0; l < kVec; ++l) acc[t][l] = 0.0f;
  if (c < C) {
    float w[9][kVec];
    load_taps(w, weight, c);
    const auto grad = [&](Index j, float(&g)[kVec]) {
      const Lanes<T, kVec> d = load_lanes<kVec>(dout, j);
#pragma unroll
      for (int l = 0; l < kVec; ++l) g[l] = to_f32(d.v[l]);
    };
    const auto input = [&](Index j, float(&x)[kVec]) {
      const Lanes<T, kVec> in = load_lanes<kVec>(inp, j);
#pragma unroll
      for (int l = 0; l < kVec; ++l) x[l] = to_f32(in.v[l]);
    };
    for (int u = u0 + threadIdx.y; u < u1; u += kRows) {
      const Column q(u * (C / kVec) + c / kVec, N, prefix, gh, gw, C, kVec);
      float g_up[3][kVec], g_mid[3][kVec], g_down[3][kVec];  // gradient rows y - 1, y, y + 1
      float x_up[3][kVec], x_mid[3][kVec], x_down[3][kVec];  // input rows y - 1, y, y + 1
      window_row(g_up, q, -1, grad);                         // zeros
      window_row(x_up, q, -1, input);
      window_row(g_mid, q, 0, grad);
      window_row(x_mid, q, 0, input);
      for (int y = 0; y < gh; ++y) {
        window_row(g_down, q, y + 1, grad);
        window_row(x_down, q, y + 1, input);
        if (dinp) {
          // Tap (dy, dx) = weight k = (dy + 1) * 3 + (dx + 1) reads the gradient at (y - dy,
          // x - dx): rows down, mid, up for dy = -1, 0, 1 and columns x + 1, x, x - 1.
          float s[kVec];
#pragma unroll
          for (int l = 0; l < kVec; ++l) {
            s[l] = 0.0f;
#pragma unroll
            for (int k = 0; k < 9; ++k) {
              const float(&row)[3][kVec] = k / 3 == 0 ? g_down : k / 3 == 1 ? g_mid : g_up;
              s[l] = __fmaf_rn(w[k][l], row[2 - k % 3][l], s[l]);
            }
          }
          store_lanes(dinp, q.at(y, q.x), s);
        }
        if (partial) {
#pragma unroll
          for (int l = 0; l < kVec; ++l) {
            const float g = g_mid[1][l];  // the output gradient at (y, x)
#pragma unroll
            for (int t = 0; t < 9; ++t) {  // tap t reads row t / 3 of (up, mid, down)
              const float(&row)[3][kVec] = t / 3 == 0 ? x_up : t / 3 == 1 ? x_mid : x_down;
              acc[t][l] = __fmaf_rn(g, row[t % 3][l], acc[t][l]);
            }
          }
        }
        shift_rows(g_up, g_mid, g_down);
        shift_rows(x_up, x_mid, x_down);
      }
    }
  }
  if (!partial) return;  // the same for the whole block
#pragma unroll
  for (int t = 0; t < 9; ++t)
#pragma unroll
    for (int l = 0; l < kVec; ++l) sm[threadIdx.y][t][threadIdx.x * kVec + l] = acc[t][l];
  __syncthreads();
  if (c < C) {
    for (int t = threadIdx.y; t < 9; t += kRows) {  // the y lanes share the 9 taps
#pragma unroll
      for (int l = 0; l < kVec; ++l) {
        float s = 0.0f;
        for (int r = 0; r < kRows; ++r) s += sm[r][t][threadIdx.x * kVec + l];
        partial[(blockIdx.y * Index(9) + t) * C + c + l] = s;
      }
    }
  }
}

__global__ void dwconv3x3_weight_finish_kernel(float* dweight, const float* partial, Index chunks,
                                               Index C) {
  // dweight (C, 9) += sum over chunks of partial (chunks, 9, C)
  const Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x;  // (c, t)
  if (i >= 9 * C) return;
  const Index c = i / 9, t = i % 9;
  float s = 0.0f;
  for (Index k = 0; k < chunks; ++k) s += partial[(k * 9 + t) * C + c];
  dweight[i] += s;
}

}  // namespace vit::cuda::dwconv_kernels
