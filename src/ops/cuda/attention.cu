// Multi-head self-attention core as batched cuBLASLt GEMMs around fp32 softmax kernels. One
// GEMM launch per head, batched over the B samples: q, k, v of head h are read straight out of
// the (B, N, 3C) qkv buffer through leading dimensions and batch strides, so nothing is
// permuted. Scores and dP are fp32 (scratch, one head at a time); only the probabilities
// (att) and dS, which feed GEMMs, are stored as T. The scratch rows (scores, dP, dS) are padded
// to a multiple of 8 elements (ldS), so their GEMMs get 16-byte aligned rows: with N = 197
// unpadded, cuBLASLt fell back to 2-byte-aligned sm75 kernels (H100 profile, 2026-11-24).
#include <cmath>

#include "ops/cuda/blas.cuh"
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per softmax row

// Row stride of the scratch score, dP and dS matrices: N rounded up to 8 elements.
Index padded_row(Index N) {
  return (N + 7) / 8 * 8;
}

template <typename T>
__global__ void softmax_forward_kernel(T* att, const float* scores, Index B, Index N, Index ldS,
                                       Index H, Index h) {
  // scores (B, N, ldS) fp32 of head h -> att (B, H, N, N), rows of head h
  const Index row = blockIdx.x * Index(kRowsPerBlock) + threadIdx.x / 32;  // in (B * N)
  const int lane = threadIdx.x % 32;
  if (row >= B * N) return;
  const Index b = row / N, i = row % N;
  const float* s = scores + row * ldS;  // (N)
  T* p = att + ((b * H + h) * N + i) * N;
  float mx = -INFINITY;
  for (Index j = lane; j < N; j += 32) mx = fmaxf(mx, s[j]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (Index j = lane; j < N; j += 32) sum += expf(s[j] - mx);
  const float inv = 1.0f / warp_sum(sum);
  for (Index j = lane; j < N; j += 32) p[j] = from_f32<T>(expf(s[j] - mx) * inv);
}

template <typename T>
__global__ void softmax_backward_kernel(T* ds, const float* dp, const T* att, Index B, Index N,
                                        Index ldS, Index H, Index h, float scale) {
  // dp (B, N, ldS) fp32 of head h; att (B, H, N, N); ds (B, N, ldS) = P * (dP - rowdot) * scale
  const Index row = blockIdx.x * Index(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B * N) return;
  const Index b = row / N, i = row % N;
  const T* p = att + ((b * H + h) * N + i) * N;  // (N)
  const float* g = dp + row * ldS;               // (N)
  float dot = 0.0f;
  for (Index j = lane; j < N; j += 32) dot += to_f32(p[j]) * g[j];
  dot = warp_sum(dot);
  T* o = ds + row * ldS;
  for (Index j = lane; j < N; j += 32) o[j] = from_f32<T>(to_f32(p[j]) * (g[j] - dot) * scale);
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, Index B, Index N, Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(D));
  const Index ldS = padded_row(N);
  auto* scores =
      static_cast<float*>(scratch(size_t(B * N * ldS) * sizeof(float), kScratchAttScores));
  for (Index h = 0; h < H; ++h) {
    const T* q = qkv + h * D;  // (B, N, D) inside (B, N, 3C)
    const T* k = q + C;
    const T* v = q + 2 * C;
    // scores[b] (N, N) = scale * q[b] (N, D) @ k[b]^T
    gemm<T, float>(false, true, N, N, D, scale, q, C3, N * C3, k, C3, N * C3, 0.0f, scores, ldS,
                   N * ldS, B);
    softmax_forward_kernel<<<blocks_for(B * N, kRowsPerBlock), kRowsPerBlock * 32, 0, stream()>>>(
        att, scores, B, N, ldS, H, h);
    VIT_CUDA_LAUNCHED();
    // out[b] (N, D) at column h * D of (B, N, C) = att[b, h] (N, N) @ v[b] (N, D)
    gemm<T, T>(false, false, N, D, N, 1.0f, att + h * N * N, N, H * N * N, v, C3, N * C3, 0.0f,
               out + h * D, C, N * C, B);
  }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, Index B, Index N,
                        Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(D));
  const Index ldS = padded_row(N);
  auto* dp = static_cast<float*>(scratch(size_t(B * N * ldS) * sizeof(float), kScratchAttScores));
  auto* ds = static_cast<T*>(scratch(size_t(B * N * ldS) * sizeof(T), kScratchAttDs));
  for (Index h = 0; h < H; ++h) {
    const T* q = qkv + h * D;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* dq = dqkv + h * D;  // (B, N, D) inside (B, N, 3C)
    T* dk = dq + C;
    T* dv = dq + 2 * C;
    const T* p = att + h * N * N;  // (B, N, N) with batch stride H * N * N
    const T* dO = dout + h * D;    // (B, N, D) inside (B, N, C)
    // dV = P^T dO
    gemm<T, T>(true, false, N, D, N, 1.0f, p, N, H * N * N, dO, C, N * C, 0.0f, dv, C3, N * C3, B);
    // dP (fp32) = dO V^T
    gemm<T, float>(false, true, N, N, D, 1.0f, dO, C, N * C, v, C3, N * C3, 0.0f, dp, ldS, N * ldS,
                   B);
    // dS = P * (dP - rowsum(P * dP)) * scale (softmax backward times the score scale)
    softmax_backward_kernel<<<blocks_for(B * N, kRowsPerBlock), kRowsPerBlock * 32, 0, stream()>>>(
        ds, dp, att, B, N, ldS, H, h, scale);
    VIT_CUDA_LAUNCHED();
    // dQ = dS K, dK = dS^T Q
    gemm<T, T>(false, false, N, D, N, 1.0f, ds, ldS, N * ldS, k, C3, N * C3, 0.0f, dq, C3, N * C3,
               B);
    gemm<T, T>(true, false, N, D, N, 1.0f, ds, ldS, N * ldS, q, C3, N * C3, 0.0f, dk, C3, N * C3,
               B);
  }
}

#define INSTANTIATE(T)                                                              \
  template void attention_forward<T>(T*, T*, const T*, Index, Index, Index, Index); \
  template void attention_backward<T>(T*, const T*, const T*, const T*, Index, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
