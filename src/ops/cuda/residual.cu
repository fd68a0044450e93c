// Residual add of a block branch with optional layer scale (gamma) and stochastic depth (a
// per-sample scale of 0 or 1/keep_prob); the layer-scale gradient is a deterministic column sum.
// The elementwise maps move 16-byte packs where they can (elementwise.cuh).
#include <initializer_list>

#include "ops/cuda/elementwise.cuh"

namespace vit::cuda {

namespace {

template <typename T>
__global__ void residual_forward_kernel(T* out, const T* x, const T* branch, const T* gamma,
                                        const float* sample_scale, Index B, Index S, Index C) {
  // out, x, branch (B, S, C); gamma (C); sample_scale (B). out may alias x: each element is
  // read and written by the same thread only.
  VIT_GRID_STRIDE(i, B * S * C) {
    const Index c = i % C, b = i / (S * C);
    const float k = sample_scale ? sample_scale[b] : 1.0f;
    const float g = gamma ? to_f32(gamma[c]) : 1.0f;
    out[i] = from_f32<T>(to_f32(x[i]) + k * g * to_f32(branch[i]));
  }
}

template <typename T>
__global__ void residual_dbranch_kernel(T* dbranch, const T* dout, const T* gamma,
                                        const float* sample_scale, Index B, Index S, Index C) {
  // dbranch, dout (B, S, C) = sample_scale[b] * gamma[c] * dout
  VIT_GRID_STRIDE(i, B * S * C) {
    const Index c = i % C, b = i / (S * C);
    const float k = sample_scale ? sample_scale[b] : 1.0f;
    const float g = gamma ? to_f32(gamma[c]) : 1.0f;
    dbranch[i] = from_f32<T>(k * g * to_f32(dout[i]));
  }
}

// The same two maps on 16-byte packs (elementwise.cuh) with 32-bit indices, when C is a
// multiple of the pack (a pack never straddles rows) and every pointer is 16-byte aligned;
// same formulas, so the same bits. kAddX: out = x + k g src (the forward, src = branch), else
// out = k g src (the branch gradient, src = dout; x unused).
template <typename T, bool kAddX>
__global__ void residual_packed_kernel(T* out, const T* x, const T* src, const T* gamma,
                                       const float* sample_scale, int npack, int SC, int C) {
  // out, x, src (B, S, C) in npack packs; gamma (C); sample_scale (B). out may alias x.
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < npack; p += gridDim.x * blockDim.x) {
    const int i = p * kPack<T>, c = i % C;
    const float k = sample_scale ? sample_scale[i / SC] : 1.0f;
    Pack<T> xv{};
    if constexpr (kAddX) xv = reinterpret_cast<const Pack<T>*>(x)[p];
    const Pack<T> sv = reinterpret_cast<const Pack<T>*>(src)[p];
    Pack<T> gv{};
    if (gamma) gv = *reinterpret_cast<const Pack<T>*>(gamma + c);
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < kPack<T>; ++j) {
      const float g = gamma ? to_f32(gv.v[j]) : 1.0f;
      if constexpr (kAddX)
        o.v[j] = from_f32<T>(to_f32(xv.v[j]) + k * g * to_f32(sv.v[j]));
      else
        o.v[j] = from_f32<T>(k * g * to_f32(sv.v[j]));
    }
    reinterpret_cast<Pack<T>*>(out)[p] = o;
  }
}

template <typename T>
bool packable(Index n, Index C, const T* gamma, std::initializer_list<const void*> ptrs) {
  if (n >= kPackedMaxN || C % kPack<T> != 0 || (gamma && !aligned16(gamma))) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

template <typename T>
struct GammaGrad {  // f(r, c) = sample_scale[b] * branch * dout at row r = b * S + s
  const T* branch;
  const T* dout;
  const float* sample_scale;
  Index S, C;
  __device__ float operator()(Index r, Index c) const {
    const float k = sample_scale ? sample_scale[r / S] : 1.0f;
    return k * to_f32(branch[r * C + c]) * to_f32(dout[r * C + c]);
  }
};

}  // namespace

template <typename T>
void residual_forward(T* out, const T* x, const T* branch, const T* gamma,
                      const float* sample_scale, Index B, Index S, Index C) {
  const Index n = B * S * C;
  if (n <= 0) return;
  if (packable(n, C, gamma, {out, x, branch})) {
    const Index npack = n / kPack<T>;
    residual_packed_kernel<T, true><<<grid_stride_blocks(npack), kBlock, 0, stream()>>>(
        out, x, branch, gamma, sample_scale, int(npack), int(S * C), int(C));
  } else {
    residual_forward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, x, branch, gamma,
                                                                            sample_scale, B, S, C);
  }
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void residual_backward(T* dbranch, float* dgamma, const T* dout, const T* branch, const T* gamma,
                       const float* sample_scale, Index B, Index S, Index C) {
  const Index n = B * S * C;
  if (n <= 0) return;
  if (dbranch && packable(n, C, gamma, {dbranch, dout})) {
    const Index npack = n / kPack<T>;
    residual_packed_kernel<T, false><<<grid_stride_blocks(npack), kBlock, 0, stream()>>>(
        dbranch, static_cast<const T*>(nullptr), dout, gamma, sample_scale, int(npack), int(S * C),
        int(C));
    VIT_CUDA_LAUNCHED();
  } else if (dbranch) {
    residual_dbranch_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dbranch, dout, gamma,
                                                                            sample_scale, B, S, C);
    VIT_CUDA_LAUNCHED();
  }
  if (dgamma) colsum_accumulate(dgamma, GammaGrad<T>{branch, dout, sample_scale, S, C}, B * S, C);
}

#define INSTANTIATE(T)                                                                            \
  template void residual_forward<T>(T*, const T*, const T*, const T*, const float*, Index, Index, \
                                    Index);                                                       \
  template void residual_backward<T>(T*, float*, const T*, const T*, const T*, const float*,      \
                                     Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
