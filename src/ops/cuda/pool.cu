// Classifier pooling: the class token, or the mean of the patch tokens.
#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/plan_timing.cuh"
#include "ops/cuda/pool_kernels.cuh"

namespace vit::cuda {

namespace {

// The backward over 8-column chunks (pool_kernels.cuh) where the kernel plan picks them (the
// pool family: "wide" by rule; the same bits as the one-thread-an-element kernel,
// tests/test_pool_on_host.cpp).
template <typename T>
bool pool_wide(Index B, Index N, Index C) {
  return planned_choice(pool_key(B, N, C, storage_of<T>())).variant == "wide";
}

template <typename T>
__global__ void pool_forward_kernel(T* out, const T* x, Index B, Index N, Index prefix, Index C,
                                    bool avg) {
  // x (B, N, C) -> out (B, C); one thread per (b, c), coalesced over c
  VIT_GRID_STRIDE(i, B * C) {
    const Index c = i % C, b = i / C;
    if (!avg) {
      out[i] = x[b * N * C + c];
      continue;
    }
    float s = 0.0f;
    for (Index n = prefix; n < N; ++n) s += to_f32(x[(b * N + n) * C + c]);
    out[i] = from_f32<T>(s * (1.0f / float(N - prefix)));
  }
}

template <typename T>
__global__ void pool_backward_kernel(T* dx, const T* dout, Index B, Index N, Index prefix, Index C,
                                     bool avg) {
  // dout (B, C) -> dx (B, N, C) accumulates: row 0 (token) or rows prefix.. (avg)
  const Index rows = avg ? N - prefix : 1, first = avg ? prefix : 0;
  const float inv = avg ? 1.0f / float(N - prefix) : 1.0f;
  VIT_GRID_STRIDE(i, B * rows * C) {
    const Index c = i % C, n = first + (i / C) % rows, b = i / (C * rows);
    T* d = dx + (b * N + n) * C + c;
    *d = from_f32<T>(to_f32(*d) + to_f32(dout[b * C + c]) * inv);
  }
}

}  // namespace

template <typename T>
void pool_forward(T* out, const T* x, Index B, Index N, Index prefix, Index C, bool avg) {
  if (B * C <= 0) return;
  pool_forward_kernel<<<grid_stride_blocks(B * C), kBlock, 0, stream()>>>(out, x, B, N, prefix, C,
                                                                          avg);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void pool_backward(T* dx, const T* dout, Index B, Index N, Index prefix, Index C, bool avg) {
  const Index rows = avg ? N - prefix : 1, n = B * rows * C;
  if (n <= 0) return;
  if (pool_wide<T>(B, N, C) && C % kChunk == 0 && n / kChunk <= INT_MAX / 2 && N <= INT_MAX &&
      all_aligned16({dx, dout})) {
    const Index chunks = n / kChunk;
    pool_kernels::pool_backward_chunks_kernel<<<grid_stride_blocks(chunks), kBlock, 0, stream()>>>(
        dx, dout, int(N), int(C), avg ? int(prefix) : 0, int(rows), int(chunks),
        avg ? 1.0f / float(rows) : 1.0f);
    VIT_CUDA_LAUNCHED();
    return;
  }
  pool_backward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dx, dout, B, N, prefix, C,
                                                                       avg);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T)                                                           \
  template void pool_forward<T>(T*, const T*, Index, Index, Index, Index, bool); \
  template void pool_backward<T>(T*, const T*, Index, Index, Index, Index, bool);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
