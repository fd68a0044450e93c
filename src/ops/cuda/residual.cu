// Residual add of a block branch with optional layer scale (gamma) and stochastic depth (a
// per-sample scale of 0 or 1/keep_prob); the layer-scale gradient is a deterministic column sum.
// The elementwise maps move 16-byte packs where they can (elementwise.cuh). The stream x, out
// and its gradient dout are X (ops.h): with X = float (T = bf16) the sum is stored unrounded and
// dbranch is rounded once from fp32.
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/residual_sum.cuh"

namespace vit::cuda {

namespace {

template <typename T, typename X>
__global__ void residual_forward_kernel(X* out, const X* x, const T* branch, const T* gamma,
                                        const float* sample_scale, Index B, Index S, Index C) {
  // out, x (B, S, C) in X, branch (B, S, C); gamma (C); sample_scale (B). out may alias x: each
  // element is read and written by the same thread only.
  VIT_GRID_STRIDE(i, B * S * C) {
    const Index c = i % C, b = i / (S * C);
    const float k = sample_scale ? sample_scale[b] : 1.0f;
    const float g = gamma ? to_f32(gamma[c]) : 1.0f;
    out[i] = from_f32<X>(residual_sum(to_f32(x[i]), k * g, to_f32(branch[i])));
  }
}

template <typename T, typename X>
__global__ void residual_dbranch_kernel(T* dbranch, const X* dout, const T* gamma,
                                        const float* sample_scale, Index B, Index S, Index C) {
  // dbranch (B, S, C) = sample_scale[b] * gamma[c] * dout (B, S, C) in X
  VIT_GRID_STRIDE(i, B * S * C) {
    const Index c = i % C, b = i / (S * C);
    const float k = sample_scale ? sample_scale[b] : 1.0f;
    const float g = gamma ? to_f32(gamma[c]) : 1.0f;
    dbranch[i] = from_f32<T>(k * g * to_f32(dout[i]));
  }
}

// The same two maps with 16-byte loads and stores (elementwise.cuh) and 32-bit indices, when C
// is a multiple of T's pack (a pack never straddles rows) and every pointer is 16-byte aligned;
// same formulas, so the same bits. A thread takes one pack of T (the narrower type) and the
// same elements of X. kAddX: out = x + k g src (the forward: out in X, src = branch in T), else
// out = k g src (the branch gradient: out in T, src = dout in X; x unused).
template <typename T, typename X, bool kAddX>
__global__ void residual_packed_kernel(std::conditional_t<kAddX, X, T>* out, const X* x,
                                       const std::conditional_t<kAddX, T, X>* src, const T* gamma,
                                       const float* sample_scale, int npack, int SC, int C) {
  // out, x, src (B, S, C) in npack packs of T's width; gamma (C); sample_scale (B). out may
  // alias x.
  using O = std::conditional_t<kAddX, X, T>;
  using Src = std::conditional_t<kAddX, T, X>;
  constexpr int G = kPack<T>;
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < npack; p += gridDim.x * blockDim.x) {
    const int i = p * G, c = i % C;
    const float k = sample_scale ? sample_scale[i / SC] : 1.0f;
    Pack<X, G> xv{};
    if constexpr (kAddX) xv = reinterpret_cast<const Pack<X, G>*>(x)[p];
    const Pack<Src, G> sv = reinterpret_cast<const Pack<Src, G>*>(src)[p];
    Pack<T, G> gv{};
    if (gamma) gv = *reinterpret_cast<const Pack<T, G>*>(gamma + c);
    Pack<O, G> o;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const float g = gamma ? to_f32(gv.v[j]) : 1.0f;
      if constexpr (kAddX)
        o.v[j] = from_f32<O>(residual_sum(to_f32(xv.v[j]), k * g, to_f32(sv.v[j])));
      else
        o.v[j] = from_f32<O>(k * g * to_f32(sv.v[j]));
    }
    reinterpret_cast<Pack<O, G>*>(out)[p] = o;
  }
}

template <typename T>
bool packable(Index n, Index C, const T* gamma, std::initializer_list<const void*> ptrs) {
  return n < kPackedMaxN && C % kPack<T> == 0 && aligned16(gamma) && all_aligned16(ptrs);
}

template <typename T, typename X>
struct GammaGrad {  // f(r, c) = sample_scale[b] * branch * dout at row r = b * S + s
  const T* branch;
  const X* dout;
  const float* sample_scale;
  Index S, C;
  __device__ float operator()(Index r, Index c) const {
    const float k = sample_scale ? sample_scale[r / S] : 1.0f;
    return k * to_f32(branch[r * C + c]) * to_f32(dout[r * C + c]);
  }
};

}  // namespace

template <typename T, typename X>
void residual_forward(X* out, const X* x, const T* branch, const T* gamma,
                      const float* sample_scale, Index B, Index S, Index C) {
  const Index n = B * S * C;
  if (n <= 0) return;
  if (packable(n, C, gamma, {out, x, branch})) {
    const Index npack = n / kPack<T>;
    residual_packed_kernel<T, X, true><<<grid_stride_blocks(npack), kBlock, 0, stream()>>>(
        out, x, branch, gamma, sample_scale, int(npack), int(S * C), int(C));
  } else {
    residual_forward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, x, branch, gamma,
                                                                            sample_scale, B, S, C);
  }
  VIT_CUDA_LAUNCHED();
}

template <typename T, typename X>
void residual_backward(T* dbranch, float* dgamma, const X* dout, const T* branch, const T* gamma,
                       const float* sample_scale, Index B, Index S, Index C) {
  const Index n = B * S * C;
  if (n <= 0) return;
  if (dbranch && packable(n, C, gamma, {dbranch, dout})) {
    const Index npack = n / kPack<T>;
    residual_packed_kernel<T, X, false><<<grid_stride_blocks(npack), kBlock, 0, stream()>>>(
        dbranch, static_cast<const X*>(nullptr), dout, gamma, sample_scale, int(npack), int(S * C),
        int(C));
    VIT_CUDA_LAUNCHED();
  } else if (dbranch) {
    residual_dbranch_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dbranch, dout, gamma,
                                                                            sample_scale, B, S, C);
    VIT_CUDA_LAUNCHED();
  }
  if (dgamma)
    colsum_accumulate(dgamma, GammaGrad<T, X>{branch, dout, sample_scale, S, C}, B * S, C);
}

#define INSTANTIATE(T, X)                                                                       \
  template void residual_forward<T, X>(X*, const X*, const T*, const T*, const float*, Index,   \
                                       Index, Index);                                           \
  template void residual_backward<T, X>(T*, float*, const X*, const T*, const T*, const float*, \
                                        Index, Index, Index);
VIT_CUDA_INSTANTIATE_STREAM(INSTANTIATE)

}  // namespace vit::cuda
