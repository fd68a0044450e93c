// Depthwise 3x3 convolution (stride 1, zero padding 1) on the channels-last token grid. One
// thread per (b, n, c) output: neighbouring threads read neighbouring channels, so every tap
// is a coalesced row read, and the prefix (class-token) rows are written as 0 in the same pass.
#include <algorithm>

#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

template <typename T>
__global__ void dwconv3x3_forward_kernel(T* out, const T* inp, const T* weight, Index B, Index N,
                                         Index prefix, Index gh, Index gw, Index C) {
  // inp, out (B, N, C), grid rows after `prefix`; weight (C, 1, 3, 3)
  VIT_GRID_STRIDE(i, B * N * C) {
    const Index c = i % C, n = (i / C) % N, b = i / (C * N);
    if (n < prefix) {
      out[i] = from_f32<T>(0.0f);  // class token bypass
      continue;
    }
    const Index p = n - prefix, y = p / gw, x = p % gw;
    const T* img = inp + (b * N + prefix) * C + c;  // (gh, gw) of channel c, stride C
    float acc = 0.0f;
    for (int dy = -1; dy <= 1; ++dy) {
      const Index yy = y + dy;
      if (yy < 0 || yy >= gh) continue;
      for (int dx = -1; dx <= 1; ++dx) {
        const Index xx = x + dx;
        if (xx < 0 || xx >= gw) continue;
        acc += to_f32(weight[c * 9 + (dy + 1) * 3 + (dx + 1)]) * to_f32(img[(yy * gw + xx) * C]);
      }
    }
    out[i] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void dwconv3x3_backward_input_kernel(T* dinp, const T* dout, const T* weight, Index B,
                                                Index N, Index prefix, Index gh, Index gw,
                                                Index C) {
  // dinp, dout (B, N, C); gather form: input (y, x) fed output (y - dy, x - dx) via tap (dy, dx)
  VIT_GRID_STRIDE(i, B * N * C) {
    const Index c = i % C, n = (i / C) % N, b = i / (C * N);
    if (n < prefix) {
      dinp[i] = from_f32<T>(0.0f);
      continue;
    }
    const Index p = n - prefix, y = p / gw, x = p % gw;
    const T* g = dout + (b * N + prefix) * C + c;
    float acc = 0.0f;
    for (int dy = -1; dy <= 1; ++dy) {
      const Index yy = y - dy;
      if (yy < 0 || yy >= gh) continue;
      for (int dx = -1; dx <= 1; ++dx) {
        const Index xx = x - dx;
        if (xx < 0 || xx >= gw) continue;
        acc += to_f32(weight[c * 9 + (dy + 1) * 3 + (dx + 1)]) * to_f32(g[(yy * gw + xx) * C]);
      }
    }
    dinp[i] = from_f32<T>(acc);
  }
}

constexpr int kRows = 8;  // block (32 channels, kRows pixel lanes)

template <typename T>
__global__ void dwconv3x3_weight_partial_kernel(float* partial, const T* dout, const T* inp,
                                                Index B, Index N, Index prefix, Index gh, Index gw,
                                                Index C, Index pix_per_chunk) {
  // partial (chunks, 9, C): sum over this chunk's pixels of dout[pixel] * inp[pixel + tap]
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
      const float g = to_f32(dout[base + p * C]);
#pragma unroll
      for (int t = 0; t < 9; ++t) {
        const Index yy = y + t / 3 - 1, xx = x + t % 3 - 1;
        if (yy >= 0 && yy < gh && xx >= 0 && xx < gw)
          acc[t] += g * to_f32(inp[base + (yy * gw + xx) * C]);
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

}  // namespace

template <typename T>
void dwconv3x3_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix,
                       Index gh, Index gw, Index C) {
  VIT_CHECK(N - prefix == gh * gw, "dwconv3x3: N - prefix must equal gh * gw");
  const Index n = B * N * C;
  if (n <= 0) return;
  dwconv3x3_forward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, inp, weight, B, N,
                                                                           prefix, gh, gw, C);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void dwconv3x3_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                        Index B, Index N, Index prefix, Index gh, Index gw, Index C) {
  VIT_CHECK(N - prefix == gh * gw, "dwconv3x3: N - prefix must equal gh * gw");
  if (B * N * C <= 0) return;
  if (dinp) {
    dwconv3x3_backward_input_kernel<<<grid_stride_blocks(B * N * C), kBlock, 0, stream()>>>(
        dinp, dout, weight, B, N, prefix, gh, gw, C);
    VIT_CUDA_LAUNCHED();
  }
  if (dweight) {
    const Index total = B * gh * gw, col_blocks = (C + 31) / 32;
    Index chunks = (4 * Index(num_sms()) + col_blocks - 1) / col_blocks;
    chunks = std::min(chunks, (total + 63) / 64);
    chunks = std::max<Index>(1, std::min<Index>(chunks, 65535));
    const Index pix_per_chunk = (total + chunks - 1) / chunks;
    auto* partial =
        static_cast<float*>(scratch(size_t(chunks * 9 * C) * sizeof(float), kScratchDwconv));
    dwconv3x3_weight_partial_kernel<<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(32, kRows),
                                      0, stream()>>>(partial, dout, inp, B, N, prefix, gh, gw, C,
                                                     pix_per_chunk);
    VIT_CUDA_LAUNCHED();
    dwconv3x3_weight_finish_kernel<<<blocks_for(9 * C), kBlock, 0, stream()>>>(dweight, partial,
                                                                               chunks, C);
    VIT_CUDA_LAUNCHED();
  }
}

#define INSTANTIATE(T)                                                                          \
  template void dwconv3x3_forward<T>(T*, const T*, const T*, Index, Index, Index, Index, Index, \
                                     Index);                                                    \
  template void dwconv3x3_backward<T>(T*, float*, const T*, const T*, const T*, Index, Index,   \
                                      Index, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
