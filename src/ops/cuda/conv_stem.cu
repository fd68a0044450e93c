// The conv stem's 3x3 stride-2 padding-1 convolution as im2col + GEMM (the GPU twin of
// src/ops/cpu/conv_stem.cpp). Both kernels are gathers, one thread per output element: im2col
// writes one column entry, col2im sums the at most 2 x 2 taps that copied an input element (in
// fp32, in (kh, kw) order, rounded once), so there are no atomics and reruns give the same bits.
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

template <typename T>
__global__ void im2col3x3s2_kernel(T* cols, const T* inp, Index B, Index H, Index W, Index C,
                                   bool nchw) {
  // inp (B, H, W, C) or (B, C, H, W) -> cols (B, Ho, Wo, C*9), each row (c, kh, kw)
  const Index Ho = (H + 1) / 2, Wo = (W + 1) / 2, F = C * 9;
  const Index sc = nchw ? H * W : 1, sw = nchw ? 1 : C, sh = W * sw;
  VIT_GRID_STRIDE(i, B * Ho * Wo * F) {
    const Index f = i % F, q = i / F;
    const Index wo = q % Wo, ho = (q / Wo) % Ho, b = q / (Wo * Ho);
    const Index c = f / 9, kh = (f % 9) / 3, kw = f % 3;
    const Index h = 2 * ho - 1 + kh, w = 2 * wo - 1 + kw;
    const bool inside = h >= 0 && h < H && w >= 0 && w < W;
    cols[i] = inside ? inp[b * H * W * C + h * sh + w * sw + c * sc] : from_f32<T>(0.0f);
  }
}

template <typename T>
__global__ void col2im3x3s2_kernel(T* dinp, const T* dcols, Index B, Index H, Index W, Index C) {
  // dcols (B, Ho, Wo, C*9) -> dinp (B, H, W, C); tap kh of output row ho reads h = 2 ho - 1 + kh
  const Index Ho = (H + 1) / 2, Wo = (W + 1) / 2, F = C * 9;
  VIT_GRID_STRIDE(i, B * H * W * C) {
    const Index c = i % C, w = (i / C) % W, h = (i / (C * W)) % H, b = i / (C * W * H);
    float s = 0.0f;
    for (Index kh = 0; kh < 3; ++kh) {
      const Index th = h + 1 - kh;
      if (th < 0 || th % 2 != 0 || th / 2 >= Ho) continue;
      for (Index kw = 0; kw < 3; ++kw) {
        const Index tw = w + 1 - kw;
        if (tw < 0 || tw % 2 != 0 || tw / 2 >= Wo) continue;
        s += to_f32(dcols[((b * Ho + th / 2) * Wo + tw / 2) * F + c * 9 + kh * 3 + kw]);
      }
    }
    dinp[i] = from_f32<T>(s);
  }
}

}  // namespace

template <typename T>
void im2col3x3s2(T* cols, const T* inp, Index B, Index H, Index W, Index C, bool nchw) {
  const Index n = B * ((H + 1) / 2) * ((W + 1) / 2) * C * 9;
  if (n <= 0) return;
  im2col3x3s2_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(cols, inp, B, H, W, C, nchw);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void col2im3x3s2(T* dinp, const T* dcols, Index B, Index H, Index W, Index C) {
  const Index n = B * H * W * C;
  if (n <= 0) return;
  col2im3x3s2_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dinp, dcols, B, H, W, C);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T)                                                          \
  template void im2col3x3s2<T>(T*, const T*, Index, Index, Index, Index, bool); \
  template void col2im3x3s2<T>(T*, const T*, Index, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
