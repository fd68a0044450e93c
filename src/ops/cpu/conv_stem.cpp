// The conv stem's 3x3 stride-2 padding-1 convolution as im2col + GEMM: im2col gathers each
// output pixel's 3x3 receptive field into one row, col2im is its adjoint (a gather as well: each
// input element sums the at most 2 x 2 taps that read it, so no two threads write one element).
#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

namespace {
// Output side of a 3x3 stride-2 padding-1 convolution.
constexpr Index out_side(Index s) {
  return (s + 1) / 2;
}
}  // namespace

template <typename T>
void im2col3x3s2(T* cols, const T* inp, Index B, Index H, Index W, Index C, bool nchw) {
  const Index Ho = out_side(H), Wo = out_side(W), F = C * 9;
  // Element strides of the input: channels-last (B, H, W, C) or the image's (B, C, H, W).
  const Index sc = nchw ? H * W : 1, sw = nchw ? 1 : C, sh = W * sw, sb = H * W * C;
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index ho = 0; ho < Ho; ++ho) {
      for (Index wo = 0; wo < Wo; ++wo) {
        T* dst = cols + ((b * Ho + ho) * Wo + wo) * F;  // (C, 3, 3)
        for (Index kh = 0; kh < 3; ++kh) {
          const Index h = 2 * ho - 1 + kh;
          for (Index kw = 0; kw < 3; ++kw) {
            const Index w = 2 * wo - 1 + kw, t = kh * 3 + kw;
            if (h < 0 || h >= H || w < 0 || w >= W) {
              for (Index c = 0; c < C; ++c) dst[c * 9 + t] = T(0);
              continue;
            }
            const T* src = inp + b * sb + h * sh + w * sw;
            for (Index c = 0; c < C; ++c) dst[c * 9 + t] = src[c * sc];
          }
        }
      }
    }
  }
}

template <typename T>
void col2im3x3s2(T* dinp, const T* dcols, Index B, Index H, Index W, Index C) {
  const Index Ho = out_side(H), Wo = out_side(W), F = C * 9;
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index h = 0; h < H; ++h) {
      for (Index w = 0; w < W; ++w) {
        T* dst = dinp + ((b * H + h) * W + w) * C;  // (C)
        for (Index c = 0; c < C; ++c) dst[c] = T(0);
        // Tap kh of output row ho reads h = 2 ho - 1 + kh, so kh = h + 1 - 2 ho in [0, 3).
        for (Index kh = 0; kh < 3; ++kh) {
          const Index th = h + 1 - kh;
          if (th < 0 || th % 2 != 0 || th / 2 >= Ho) continue;
          for (Index kw = 0; kw < 3; ++kw) {
            const Index tw = w + 1 - kw;
            if (tw < 0 || tw % 2 != 0 || tw / 2 >= Wo) continue;
            const T* src = dcols + ((b * Ho + th / 2) * Wo + tw / 2) * F + kh * 3 + kw;
            for (Index c = 0; c < C; ++c) dst[c] += src[c * 9];
          }
        }
      }
    }
  }
}

#define INSTANTIATE(T)                                                          \
  template void im2col3x3s2<T>(T*, const T*, Index, Index, Index, Index, bool); \
  template void col2im3x3s2<T>(T*, const T*, Index, Index, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
