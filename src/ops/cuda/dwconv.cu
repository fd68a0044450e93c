// Depthwise 3x3 convolution (stride 1, zero padding 1) on the channels-last token grid. One
// thread per (b, n, c) output: neighbouring threads read neighbouring channels, so every tap
// is a coalesced row read, and the prefix (class-token) rows are written as 0 in the same pass.
//
// The locality FFN's middle (h-swish, this conv, h-swish) runs through the same kernels with
// kLocal: the forward applies the first h-swish to each tap as it loads fc1 (rounded to T, as
// the stored act1 would be) and the second to its own sum; the backward forms the h-swish
// gradient of each tap it reads from dact2 and dw, and applies fc1's h-swish gradient to its
// sum; the weight gradient recomputes act1 from fc1, so act1 need not be stored. Every value is
// rounded where the three separate ops store it, with the same functors (activation_math.cuh)
// and explicit fmas, so the fused passes give the three ops' bits while moving (B, N, M)
// tensors 3 times forward (not 6) and 7 times backward (not 10).
#include <algorithm>

#include "ops/cuda/activation_math.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops.h"

namespace vit::cuda {

namespace {

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

// Where (b, n, c) of a (B, N, C) tensor with `prefix` class-token rows sits on the (gh, gw)
// grid; 32-bit divisions (the callers check B N C < 2^31; the grid-stride index stays 64-bit).
struct GridPos {
  int c, b, y, x;
  bool grid;  // false: a class-token row
  __device__ GridPos(int i, int N, int prefix, int gw, int C) {
    c = i % C;
    const int bn = i / C, n = bn % N;
    b = bn / N;
    grid = n >= prefix;
    const int p = n - prefix;
    y = grid ? p / gw : 0;
    x = grid ? p % gw : 0;
  }
};

template <typename T, bool kLocal>
__global__ void dwconv3x3_forward_kernel(T* out, const T* inp, const T* weight, T* act1, T* act2,
                                         int total, int N, int prefix, int gh, int gw, int C) {
  // inp, out (B, N, C), grid rows after `prefix`; weight (C, 1, 3, 3). kLocal: inp is fc1, out
  // is dw = conv(hswish(fc1)); act2 = hswish(dw) and, unless nullptr, act1 = hswish(fc1)
  // (B, N, C) are written too.
  VIT_GRID_STRIDE(i, total) {
    const GridPos q(int(i), N, prefix, gw, C);
    if constexpr (kLocal)
      if (act1) act1[i] = from_f32<T>(HswishForward{}(to_f32(inp[i])));
    float acc = 0.0f;
    if (q.grid) {
      const T* img = inp + (Index(q.b) * N + prefix) * C + q.c;  // (gh, gw) of channel c, stride C
      for (int dy = -1; dy <= 1; ++dy) {
        const int yy = q.y + dy;
        if (yy < 0 || yy >= gh) continue;
        for (int dx = -1; dx <= 1; ++dx) {
          const int xx = q.x + dx;
          if (xx < 0 || xx >= gw) continue;
          const float v = conv_input<T, kLocal>(img[(yy * gw + xx) * C]);
          acc = __fmaf_rn(to_f32(weight[q.c * 9 + (dy + 1) * 3 + (dx + 1)]), v, acc);
        }
      }
    }
    out[i] = from_f32<T>(acc);  // class-token rows: 0 (the token bypasses the conv)
    if constexpr (kLocal) act2[i] = from_f32<T>(HswishForward{}(stored<T>(acc)));
  }
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

template <typename T, bool kLocal>
__global__ void dwconv3x3_backward_input_kernel(T* dinp, const T* dout, const T* weight,
                                                const T* dw, const T* fc1, int total, int N,
                                                int prefix, int gh, int gw, int C) {
  // dinp, dout (B, N, C); gather form: input (y, x) fed output (y - dy, x - dx) via tap (dy, dx).
  // kLocal: dout is dact2, dw the conv's output, and dinp = dfc1 = hswish'(fc1) * d(act1).
  VIT_GRID_STRIDE(i, total) {
    const GridPos q(int(i), N, prefix, gw, C);
    float acc = 0.0f;
    if (q.grid) {
      const Index base = (Index(q.b) * N + prefix) * C + q.c;  // (gh, gw) of channel c, stride C
      for (int dy = -1; dy <= 1; ++dy) {
        const int yy = q.y - dy;
        if (yy < 0 || yy >= gh) continue;
        for (int dx = -1; dx <= 1; ++dx) {
          const int xx = q.x - dx;
          if (xx < 0 || xx >= gw) continue;
          const float g = conv_grad<T, kLocal>(dout, dw, base + Index(yy * gw + xx) * C);
          acc = __fmaf_rn(to_f32(weight[q.c * 9 + (dy + 1) * 3 + (dx + 1)]), g, acc);
        }
      }
    }
    if constexpr (kLocal)
      dinp[i] = from_f32<T>(HswishBackward{}(stored<T>(acc), to_f32(fc1[i])));
    else
      dinp[i] = from_f32<T>(acc);  // class-token rows: 0
  }
}

constexpr int kRows = 8;  // block (32 channels, kRows pixel lanes)

template <typename T, bool kLocal>
__global__ void dwconv3x3_weight_partial_kernel(float* partial, const T* dout, const T* inp,
                                                const T* dw, Index B, Index N, Index prefix,
                                                Index gh, Index gw, Index C, Index pix_per_chunk) {
  // partial (chunks, 9, C): sum over this chunk's pixels of dout[pixel] * inp[pixel + tap]
  // (kLocal: dout is dact2, turned into the conv's output gradient with dw; inp is fc1, whose
  // h-swish is the conv's input act1, recomputed rather than stored)
  __shared__ float sm[kRows][9][33];
  const Index c = blockIdx.x * Index(32) + threadIdx.x;
  const Index G = gh * gw, total = B * G;
  const Index q0 = blockIdx.y * pix_per_chunk;
  const Index q1 = q0 + pix_per_chunk < total ? q0 + pix_per_chunk : total;
  float acc[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (c < C) {
    for (Index q = q0 + threadIdx.y; q < q1; q += kRows) {
      const Index b = q / G, p = q % G, y = p / gw, x = p % gw;
      const Index base = (b * N + prefix) * C + c;
      const float g = conv_grad<T, kLocal>(dout, dw, base + p * C);
#pragma unroll
      for (int t = 0; t < 9; ++t) {
        const Index yy = y + t / 3 - 1, xx = x + t % 3 - 1;
        if (yy >= 0 && yy < gh && xx >= 0 && xx < gw)
          acc[t] = __fmaf_rn(g, conv_input<T, kLocal>(inp[base + (yy * gw + xx) * C]), acc[t]);
      }
    }
  }
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

int checked_total(Index B, Index N, Index prefix, Index gh, Index gw, Index C) {
  VIT_CHECK(N - prefix == gh * gw, "dwconv3x3: N - prefix must equal gh * gw");
  VIT_CHECK(B * N * C < (Index(1) << 31), "dwconv3x3: tensor too large for 32-bit indices");
  return int(B * N * C);
}

template <typename T, bool kLocal>
void conv_forward(T* out, const T* inp, const T* weight, T* act1, T* act2, Index B, Index N,
                  Index prefix, Index gh, Index gw, Index C) {
  const int total = checked_total(B, N, prefix, gh, gw, C);
  if (total <= 0) return;
  dwconv3x3_forward_kernel<T, kLocal><<<grid_stride_blocks(total), kBlock, 0, stream()>>>(
      out, inp, weight, act1, act2, total, int(N), int(prefix), int(gh), int(gw), int(C));
  VIT_CUDA_LAUNCHED();
}

template <typename T, bool kLocal>
void conv_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                   const T* dw, const T* fc1, Index B, Index N, Index prefix, Index gh, Index gw,
                   Index C) {
  const int total = checked_total(B, N, prefix, gh, gw, C);
  if (total <= 0) return;
  if (dinp) {
    dwconv3x3_backward_input_kernel<T, kLocal><<<grid_stride_blocks(total), kBlock, 0, stream()>>>(
        dinp, dout, weight, dw, fc1, total, int(N), int(prefix), int(gh), int(gw), int(C));
    VIT_CUDA_LAUNCHED();
  }
  if (!dweight) return;
  const Index pixels = B * gh * gw, col_blocks = (C + 31) / 32;
  Index chunks = (4 * Index(num_sms()) + col_blocks - 1) / col_blocks;
  chunks = std::min(chunks, (pixels + 63) / 64);
  chunks = std::max<Index>(1, std::min<Index>(chunks, 65535));
  const Index pix_per_chunk = (pixels + chunks - 1) / chunks;
  auto* partial =
      static_cast<float*>(scratch(size_t(chunks * 9 * C) * sizeof(float), kScratchDwconv));
  dwconv3x3_weight_partial_kernel<T, kLocal>
      <<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(32, kRows), 0, stream()>>>(
          partial, dout, inp, dw, B, N, prefix, gh, gw, C, pix_per_chunk);
  VIT_CUDA_LAUNCHED();
  dwconv3x3_weight_finish_kernel<<<blocks_for(9 * C), kBlock, 0, stream()>>>(dweight, partial,
                                                                             chunks, C);
  VIT_CUDA_LAUNCHED();
}

}  // namespace

template <typename T>
void dwconv3x3_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix,
                       Index gh, Index gw, Index C) {
  conv_forward<T, false>(out, inp, weight, nullptr, nullptr, B, N, prefix, gh, gw, C);
}

template <typename T>
void dwconv3x3_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                        Index B, Index N, Index prefix, Index gh, Index gw, Index C) {
  conv_backward<T, false>(dinp, dweight, dout, inp, weight, nullptr, nullptr, B, N, prefix, gh, gw,
                          C);
}

namespace {

bool local_ffn_fused() {  // VIT_FUSE_LOCAL_FFN=0: the separate ops
  return env_switch_on("VIT_FUSE_LOCAL_FFN");
}

// `count` (n) buffers in one scratch slot, each starting 256-byte aligned (the maps' packs),
// for the separate ops' act1 (forward) or act1 and d(act1) (backward).
template <typename T>
T* separate_ops_scratch(Index n, int count) {
  const size_t stride = (size_t(n) * sizeof(T) + 255) / 256 * 256;
  return static_cast<T*>(scratch(stride * size_t(count), kScratchLocalFfn));
}
template <typename T>
T* second_buffer(T* first, Index n) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(first) +
                              (size_t(n) * sizeof(T) + 255) / 256 * 256);
}

}  // namespace

template <typename T>
void local_ffn_forward(T* act1, T* dw, T* act2, const T* fc1, const T* weight, Index B, Index N,
                       Index prefix, Index gh, Index gw, Index M) {
  if (local_ffn_fused())
    return conv_forward<T, true>(dw, fc1, weight, act1, act2, B, N, prefix, gh, gw, M);
  const Index n = B * N * M;
  T* a1 = act1 ? act1 : separate_ops_scratch<T>(n, 1);
  hswish_forward(a1, fc1, n);
  dwconv3x3_forward(dw, static_cast<const T*>(a1), weight, B, N, prefix, gh, gw, M);
  hswish_forward(act2, static_cast<const T*>(dw), n);
}

template <typename T>
void local_ffn_backward(T* dfc1, float* dweight, T* dact2, const T* dw, const T* /*act1*/,
                        const T* fc1, const T* weight, Index B, Index N, Index prefix, Index gh,
                        Index gw, Index M) {
  // act1 is recomputed from fc1 where the weight gradient reads it. dact2 stays as it was (the
  // host backends' version overwrites it).
  if (local_ffn_fused())
    return conv_backward<T, true>(dfc1, dweight, dact2, fc1, weight, dw, fc1, B, N, prefix, gh, gw,
                                  M);
  // The separate ops (dfc1 holds ddw until the last one; act1 and d(act1) in scratch, so dact2
  // stays as it was here too).
  const Index n = B * N * M;
  T* a1 = separate_ops_scratch<T>(n, 2);
  T* dact1 = second_buffer(a1, n);
  hswish_forward(a1, fc1, n);
  hswish_backward(dfc1, static_cast<const T*>(dact2), dw, n);
  dwconv3x3_backward(dact1, dweight, static_cast<const T*>(dfc1), static_cast<const T*>(a1), weight,
                     B, N, prefix, gh, gw, M);
  hswish_backward(dfc1, static_cast<const T*>(dact1), fc1, n);
}

#define INSTANTIATE(T)                                                                           \
  template void dwconv3x3_forward<T>(T*, const T*, const T*, Index, Index, Index, Index, Index,  \
                                     Index);                                                     \
  template void dwconv3x3_backward<T>(T*, float*, const T*, const T*, const T*, Index, Index,    \
                                      Index, Index, Index, Index);                               \
  template void local_ffn_forward<T>(T*, T*, T*, const T*, const T*, Index, Index, Index, Index, \
                                     Index, Index);                                              \
  template void local_ffn_backward<T>(T*, float*, T*, const T*, const T*, const T*, const T*,    \
                                      Index, Index, Index, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
