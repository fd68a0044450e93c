// Classifier pooling: the class token, or the mean of the patch tokens. x and its accumulated
// gradient dx are the residual stream's X (ops.h): with X = float (T = bf16) out is rounded once
// from the fp32 token or mean, and dx is not rounded.
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

template <typename T, typename X>
__global__ void pool_forward_kernel(T* out, const X* x, Index B, Index N, Index prefix, Index C,
                                    bool avg) {
  // x (B, N, C) in X -> out (B, C); one thread per (b, c), coalesced over c
  VIT_GRID_STRIDE(i, B * C) {
    const Index c = i % C, b = i / C;
    if (!avg) {
      out[i] = convert_to<T>(x[b * N * C + c]);
      continue;
    }
    float s = 0.0f;
    for (Index n = prefix; n < N; ++n) s += to_f32(x[(b * N + n) * C + c]);
    out[i] = from_f32<T>(s * (1.0f / float(N - prefix)));
  }
}

template <typename T, typename X>
__global__ void pool_backward_kernel(X* dx, const T* dout, Index B, Index N, Index prefix, Index C,
                                     bool avg) {
  // dout (B, C) -> dx (B, N, C) in X accumulates: row 0 (token) or rows prefix.. (avg)
  const Index rows = avg ? N - prefix : 1, first = avg ? prefix : 0;
  const float inv = avg ? 1.0f / float(N - prefix) : 1.0f;
  VIT_GRID_STRIDE(i, B * rows * C) {
    const Index c = i % C, n = first + (i / C) % rows, b = i / (C * rows);
    X* d = dx + (b * N + n) * C + c;
    *d = from_f32<X>(to_f32(*d) + to_f32(dout[b * C + c]) * inv);
  }
}

}  // namespace

template <typename T, typename X>
void pool_forward(T* out, const X* x, Index B, Index N, Index prefix, Index C, bool avg) {
  if (B * C <= 0) return;
  pool_forward_kernel<<<grid_stride_blocks(B * C), kBlock, 0, stream()>>>(out, x, B, N, prefix, C,
                                                                          avg);
  VIT_CUDA_LAUNCHED();
}

template <typename T, typename X>
void pool_backward(X* dx, const T* dout, Index B, Index N, Index prefix, Index C, bool avg) {
  const Index n = B * (avg ? N - prefix : 1) * C;
  if (n <= 0) return;
  pool_backward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dx, dout, B, N, prefix, C,
                                                                       avg);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T, X)                                                           \
  template void pool_forward<T, X>(T*, const X*, Index, Index, Index, Index, bool); \
  template void pool_backward<T, X>(X*, const T*, Index, Index, Index, Index, bool);
VIT_CUDA_INSTANTIATE_STREAM(INSTANTIATE)

}  // namespace vit::cuda
