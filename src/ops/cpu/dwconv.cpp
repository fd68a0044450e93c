// Depthwise 3x3 convolution (stride 1, zero padding 1) on the channels-last token grid: the
// innermost loop runs over channels, contiguous in (B, N, C), so it vectorises without any
// Seq2Im/Im2Seq transposition.
#include <omp.h>

#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

namespace {
// weight (C, 1, 3, 3) -> (9, C) so each tap is a contiguous channel vector.
template <typename T>
std::vector<T> taps_channels_last(const T* weight, Index C) {
  std::vector<T> w(9 * C);  // (9, C)
  for (Index c = 0; c < C; ++c)
    for (int t = 0; t < 9; ++t) w[t * C + c] = weight[c * 9 + t];
  return w;
}
}  // namespace

template <typename T>
void dwconv3x3_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix,
                       Index gh, Index gw, Index C) {
  const std::vector<T> w = taps_channels_last(weight, C);  // (9, C)
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index y = 0; y < gh; ++y) {
      const T* img = inp + (b * N + prefix) * C;  // (gh, gw, C)
      T* dst = out + (b * N + prefix) * C;
      if (y == 0)
        for (Index i = 0; i < prefix * C; ++i) out[b * N * C + i] = T(0);  // class token bypass
      for (Index x = 0; x < gw; ++x) {
        T* o = dst + (y * gw + x) * C;
        for (Index c = 0; c < C; ++c) o[c] = T(0);
        for (int dy = -1; dy <= 1; ++dy) {
          const Index yy = y + dy;
          if (yy < 0 || yy >= gh) continue;
          for (int dx = -1; dx <= 1; ++dx) {
            const Index xx = x + dx;
            if (xx < 0 || xx >= gw) continue;
            const T* src = img + (yy * gw + xx) * C;
            const T* wt = w.data() + ((dy + 1) * 3 + (dx + 1)) * C;
#pragma omp simd
            for (Index c = 0; c < C; ++c) o[c] += wt[c] * src[c];
          }
        }
      }
    }
  }
}

template <typename T>
void dwconv3x3_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, Index B,
                        Index N, Index prefix, Index gh, Index gw, Index C) {
  const std::vector<T> w = taps_channels_last(weight, C);  // (9, C)
  const int nthreads = omp_get_max_threads();
  std::vector<T> partial(size_t(nthreads) * 9 * C, T(0));  // (threads, 9, C) dweight partials
#pragma omp parallel
  {
    T* dw_t = partial.data() + size_t(omp_get_thread_num()) * 9 * C;
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index y = 0; y < gh; ++y) {
        const T* img = inp + (b * N + prefix) * C;
        const T* g = dout + (b * N + prefix) * C;
        T* di = dinp ? dinp + (b * N + prefix) * C : nullptr;
        if (di && y == 0)
          for (Index i = 0; i < prefix * C; ++i) dinp[b * N * C + i] = T(0);
        for (Index x = 0; x < gw; ++x) {
          // Gather form for dinp (each input pixel owned by one iteration): input (y, x)
          // feeds output (y - dy, x - dx) through tap (dy, dx).
          T* dst = di ? di + (y * gw + x) * C : nullptr;
          if (dst)
            for (Index c = 0; c < C; ++c) dst[c] = T(0);
          const T* src = img + (y * gw + x) * C;
          for (int dy = -1; dy <= 1; ++dy) {
            const Index yy = y - dy;
            if (yy < 0 || yy >= gh) continue;
            for (int dx = -1; dx <= 1; ++dx) {
              const Index xx = x - dx;
              if (xx < 0 || xx >= gw) continue;
              const int t = (dy + 1) * 3 + (dx + 1);
              const T* go = g + (yy * gw + xx) * C;
              const T* wt = w.data() + t * C;
              T* dwt = dw_t + t * C;
              if (dst) {
#pragma omp simd
                for (Index c = 0; c < C; ++c) dst[c] += wt[c] * go[c];
              }
#pragma omp simd
              for (Index c = 0; c < C; ++c) dwt[c] += go[c] * src[c];
            }
          }
        }
      }
    }
  }
  if (dweight)
    for (int t = 0; t < nthreads; ++t)
      for (Index c = 0; c < C; ++c)
        for (int k = 0; k < 9; ++k) dweight[c * 9 + k] += partial[(size_t(t) * 9 + k) * C + c];
}

#define INSTANTIATE(T)                                                                           \
  template void dwconv3x3_forward<T>(T*, const T*, const T*, Index, Index, Index, Index, Index,  \
                                     Index);                                                     \
  template void dwconv3x3_backward<T>(T*, T*, const T*, const T*, const T*, Index, Index, Index, \
                                      Index, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
