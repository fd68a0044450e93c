// Patch extraction (the im2col of the stride-P patch convolution) and token assembly
// (class token, position embedding).
#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void im2patches(T* patches, const T* img, Index B, Index Cin, Index Himg, Index Wimg, Index P) {
  const Index gh = Himg / P, gw = Wimg / P, F = Cin * P * P;
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index py = 0; py < gh; ++py) {
      for (Index px = 0; px < gw; ++px) {
        T* dst = patches + ((b * gh + py) * gw + px) * F;  // (Cin, P, P)
        for (Index c = 0; c < Cin; ++c)
          for (Index i = 0; i < P; ++i) {
            const T* src = img + ((b * Cin + c) * Himg + py * P + i) * Wimg + px * P;
            for (Index j = 0; j < P; ++j) dst[(c * P + i) * P + j] = src[j];
          }
      }
    }
  }
}

template <typename T>
void embed_tokens_forward(T* x, const T* patch_out, const T* cls, const T* pos, Index B, Index N,
                          Index prefix, Index C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index n = 0; n < N; ++n) {
      T* dst = x + (b * N + n) * C;
      const T* src = n < prefix ? cls : patch_out + (b * (N - prefix) + n - prefix) * C;
      const T* pe = pos + n * C;
      for (Index c = 0; c < C; ++c) dst[c] = src[c] + pe[c];
    }
  }
}

template <typename T>
void embed_tokens_backward(T* dpatch_out, T* dcls, T* dpos, const T* dx, Index B, Index N,
                           Index prefix, Index C) {
  if (dpatch_out) {
#pragma omp parallel for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b)
      for (Index n = prefix; n < N; ++n) {
        const T* src = dx + (b * N + n) * C;
        T* dst = dpatch_out + (b * (N - prefix) + n - prefix) * C;
        for (Index c = 0; c < C; ++c) dst[c] = src[c];
      }
  }
  // Sums over the batch; each token row is owned by one iteration.
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < N; ++n) {
    for (Index b = 0; b < B; ++b) {
      const T* src = dx + (b * N + n) * C;
      if (dpos)
        for (Index c = 0; c < C; ++c) dpos[n * C + c] += src[c];
      if (n < prefix && dcls)
        for (Index c = 0; c < C; ++c) dcls[c] += src[c];
    }
  }
}

#define INSTANTIATE(T)                                                                         \
  template void im2patches<T>(T*, const T*, Index, Index, Index, Index, Index);                \
  template void embed_tokens_forward<T>(T*, const T*, const T*, const T*, Index, Index, Index, \
                                        Index);                                                \
  template void embed_tokens_backward<T>(T*, T*, T*, const T*, Index, Index, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
