// Eight consecutive values of a row moved as one 16-byte word (bf16) or two (fp32): the unit of
// the kernels that read and write whole rows over 16-byte loads (layernorm_vec_kernels.cuh,
// embed_kernels.cuh). Plain CUDA C++, so tests/cuda_host_sim.h compiles it for the CPU, where a
// misaligned chunk aborts as the device would fault.
#pragma once
#include <cstdlib>

#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#endif

namespace vit::cuda {

constexpr int kChunk = 8;  // values a chunk

template <typename V>
struct alignas(16) Chunk {
  V v[kChunk];
};

template <typename V>
__device__ __forceinline__ Chunk<V> load_chunk(const V* p) {
#ifdef VIT_CUDA_HOST_SIM
  if (!aligned16(p)) std::abort();  // the device would fault
#endif
  Chunk<V> c;
  const uint4* src = reinterpret_cast<const uint4*>(p);
  uint4* dst = reinterpret_cast<uint4*>(&c);
#pragma unroll
  for (int i = 0; i < int(sizeof(Chunk<V>) / 16); ++i) dst[i] = src[i];
  return c;
}
template <typename V>
__device__ __forceinline__ void store_chunk(V* p, const Chunk<V>& c) {
#ifdef VIT_CUDA_HOST_SIM
  if (!aligned16(p)) std::abort();
#endif
  const uint4* src = reinterpret_cast<const uint4*>(&c);
  uint4* dst = reinterpret_cast<uint4*>(p);
#pragma unroll
  for (int i = 0; i < int(sizeof(Chunk<V>) / 16); ++i) dst[i] = src[i];
}
template <typename V>
__device__ __forceinline__ Chunk<V> zero_chunk() {
  Chunk<V> c;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) c.v[e] = from_f32<V>(0.0f);
  return c;
}

}  // namespace vit::cuda
