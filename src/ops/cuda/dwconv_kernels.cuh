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
#include "ops/cuda/activation_math.cuh"

namespace vit::cuda::dwconv_kernels {

// A stored T value as the next op reads it.
template <typename T>
__device__ __forceinline__ float stored(float x) {
  return to_f32(from_f32<T>(x));
}

// The conv's input at a tap: inp itself, or (kLocal) act1 = hswish(fc1) from fc1 = inp,
// rounded as the stored act1.
template <typename T, bool kLocal>
__device__ __forceinline__ float conv_input(T v) {
  if constexpr (kLocal)
    return stored<T>(HswishForward{}(to_f32(v)));
  else
    return to_f32(v);
}

// The conv's output gradient at a tap: dout itself, or (kLocal) the second h-swish's gradient
// formed from dact2 = dout and the conv's output dw, rounded as the stored ddw.
template <typename T, bool kLocal>
__device__ __forceinline__ float conv_grad(const T* dout, const T* dw, Index j) {
  if constexpr (kLocal)
    return stored<T>(HswishBackward{}(to_f32(dout[j]), to_f32(dw[j])));
  else
    return to_f32(dout[j]);
}

// One (b, x, c) column of a (B, N, C) tensor whose rows after `prefix` are the (gh, gw) grid:
// element (y, x') of the column's image and channel sits at at(y, x').
struct Column {
  int b, x, c, gh, gw;
  Index base;  // (b, prefix, c)
  Index C;
  __device__ Column(int i, int N, int prefix, int gh_, int gw_, int C_) : gh(gh_), gw(gw_), C(C_) {
    c = i % C_;
    const int bx = i / C_;
    x = bx % gw_;
    b = bx / gw_;
    base = (Index(b) * N + prefix) * C_ + c;
  }
  __device__ Index at(int y, int xx) const { return base + Index(y * gw + xx) * C; }
  __device__ bool row_in(int y) const { return y >= 0 && y < gh; }
};

// The window row y of a column: f(j) at (y, x - 1), (y, x), (y, x + 1), 0 outside the grid.
template <typename F>
__device__ __forceinline__ void window_row(float v[3], const Column& q, int y, F f) {
  v[0] = v[1] = v[2] = 0.0f;
  if (!q.row_in(y)) return;
  if (q.x > 0) v[0] = f(q.at(y, q.x - 1));
  v[1] = f(q.at(y, q.x));
  if (q.x + 1 < q.gw) v[2] = f(q.at(y, q.x + 1));
}

// The k-th element of the prefix rows, (b, p, c) with p < prefix, in (B, N, C).
__device__ __forceinline__ Index prefix_element(int k, int N, int prefix, int C) {
  const int c = k % C, bp = k / C;
  return (Index(bp / prefix) * N + bp % prefix) * C + c;
}

template <typename T, bool kLocal>
__global__ void dwconv3x3_forward_kernel(T* out, const T* inp, const T* weight, T* act1, T* act2,
                                         int columns, int prefix_total, int N, int prefix, int gh,
                                         int gw, int C) {
  // inp, out (B, N, C), grid rows after `prefix`; weight (C, 1, 3, 3). kLocal: inp is fc1, out
  // is dw = conv(hswish(fc1)); act2 = hswish(dw) and, unless nullptr, act1 = hswish(fc1)
  // (B, N, C) are written too. Threads [0, columns): a (b, x, c) column each; then one per
  // prefix element (out = 0: the class token bypasses the conv).
  VIT_GRID_STRIDE(t, Index(columns) + prefix_total) {
    if (t >= columns) {
      const Index i = prefix_element(int(t - columns), N, prefix, C);
      if constexpr (kLocal)
        if (act1) act1[i] = from_f32<T>(HswishForward{}(to_f32(inp[i])));
      out[i] = from_f32<T>(0.0f);
      if constexpr (kLocal) act2[i] = from_f32<T>(HswishForward{}(0.0f));
      continue;
    }
    const Column q(int(t), N, prefix, gh, gw, C);
    float w[9];
#pragma unroll
    for (int k = 0; k < 9; ++k) w[k] = to_f32(weight[q.c * 9 + k]);
    const auto load = [&](Index j) { return conv_input<T, kLocal>(inp[j]); };
    float up[3] = {0.0f, 0.0f, 0.0f}, mid[3], down[3];  // rows y - 1, y, y + 1
    window_row(mid, q, 0, load);
    for (int y = 0; y < gh; ++y) {
      window_row(down, q, y + 1, load);
      const Index i = q.at(y, q.x);
      if constexpr (kLocal)
        if (act1) act1[i] = from_f32<T>(HswishForward{}(to_f32(inp[i])));
      const float* rows[3] = {up, mid, down};  // tap (dy, dx) reads rows[dy + 1][dx + 1]
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < 9; ++k) acc = __fmaf_rn(w[k], rows[k / 3][k % 3], acc);
      out[i] = from_f32<T>(acc);
      if constexpr (kLocal) act2[i] = from_f32<T>(HswishForward{}(stored<T>(acc)));
#pragma unroll
      for (int k = 0; k < 3; ++k) up[k] = mid[k], mid[k] = down[k];
    }
  }
}

// dinp of a backward pass: kLocal turns d(act1) into dfc1 = hswish'(fc1) * d(act1).
template <typename T, bool kLocal>
__device__ __forceinline__ void store_input_grad(T* dinp, const T* fc1, Index i, float acc) {
  if constexpr (kLocal)
    dinp[i] = from_f32<T>(HswishBackward{}(stored<T>(acc), to_f32(fc1[i])));
  else
    dinp[i] = from_f32<T>(acc);
}

template <typename T, bool kLocal>
__global__ void dwconv3x3_backward_prefix_kernel(T* dinp, const T* fc1, int prefix_total, int N,
                                                 int prefix, int C) {
  // dinp (B, N, C): the prefix (class-token) rows, which bypass the conv, get the gradient of
  // a zero sum.
  VIT_GRID_STRIDE(t, prefix_total) {
    store_input_grad<T, kLocal>(dinp, fc1, prefix_element(int(t), N, prefix, C), 0.0f);
  }
}

constexpr int kRows = 8;  // block (32 channels, kRows column lanes)

// 4 blocks of 256 threads per SM: at most 64 registers (ptxas chose 66 unbounded).
template <typename T, bool kLocal>
__global__ void __launch_bounds__(32 * kRows, 4)
    dwconv3x3_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* weight,
                              const T* dw, int B, int N, int prefix, int gh, int gw, int C,
                              int cols_per_chunk) {
  // dinp, dout, inp (B, N, C) grid rows; partial (chunks, 9, C) or nullptr. Block (32
  // channels, kRows lanes), grid (channel blocks, chunks of (b, x) columns): each lane walks its
  // columns down with two 3x3 windows in registers, the output gradient's and the input's, and
  // in one pass forms
  //  * dinp (unless nullptr), gather form: input (y, x) fed output (y - dy, x - dx) via tap
  //    (dy, dx);
  //  * the weight gradient's partial sums over the chunk: dout[pixel] * inp[pixel + tap].
  // kLocal: dout is dact2, turned into the conv's output gradient with dw; inp is fc1, whose
  // h-swish is the conv's input act1 (recomputed rather than stored), and dinp = dfc1.
  __shared__ float sm[kRows][9][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int u0 = blockIdx.y * cols_per_chunk;
  const int u1 = min(u0 + cols_per_chunk, B * gw);
  float acc[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (c < C) {
    float w[9];
#pragma unroll
    for (int k = 0; k < 9; ++k) w[k] = to_f32(weight[c * 9 + k]);
    const auto grad = [&](Index j) { return conv_grad<T, kLocal>(dout, dw, j); };
    const auto input = [&](Index j) { return conv_input<T, kLocal>(inp[j]); };
    for (int u = u0 + threadIdx.y; u < u1; u += kRows) {
      const Column q(u * C + c, N, prefix, gh, gw, C);
      float g_up[3] = {0.0f, 0.0f, 0.0f}, g_mid[3], g_down[3];  // gradient rows y - 1, y, y + 1
      float x_up[3] = {0.0f, 0.0f, 0.0f}, x_mid[3], x_down[3];  // input rows y - 1, y, y + 1
      window_row(g_mid, q, 0, grad);
      window_row(x_mid, q, 0, input);
      for (int y = 0; y < gh; ++y) {
        window_row(g_down, q, y + 1, grad);
        window_row(x_down, q, y + 1, input);
        if (dinp) {
          // Tap (dy, dx) = weight k = (dy + 1) * 3 + (dx + 1) reads the gradient at (y - dy,
          // x - dx): rows down, mid, up for dy = -1, 0, 1 and columns x + 1, x, x - 1.
          const float* g_rows[3] = {g_down, g_mid, g_up};
          float s = 0.0f;
#pragma unroll
          for (int k = 0; k < 9; ++k) s = __fmaf_rn(w[k], g_rows[k / 3][2 - k % 3], s);
          store_input_grad<T, kLocal>(dinp, inp, q.at(y, q.x), s);
        }
        if (partial) {
          const float g = g_mid[1];                        // the output gradient at (y, x)
          const float* x_rows[3] = {x_up, x_mid, x_down};  // tap t reads x_rows[t / 3][t % 3]
#pragma unroll
          for (int t = 0; t < 9; ++t) acc[t] = __fmaf_rn(g, x_rows[t / 3][t % 3], acc[t]);
        }
#pragma unroll
        for (int k = 0; k < 3; ++k) {
          g_up[k] = g_mid[k], g_mid[k] = g_down[k];
          x_up[k] = x_mid[k], x_mid[k] = x_down[k];
        }
      }
    }
  }
  if (!partial) return;  // the same for the whole block
#pragma unroll
  for (int t = 0; t < 9; ++t) sm[threadIdx.y][t][threadIdx.x] = acc[t];
  __syncthreads();
  if (c < C) {
    for (int t = threadIdx.y; t < 9; t += kRows) {  // the y lanes share the 9 taps
      float s = 0.0f;
      for (int r = 0; r < kRows; ++r) s += sm[r][t][threadIdx.x];
      partial[(blockIdx.y * Index(9) + t) * C + c] = s;
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
