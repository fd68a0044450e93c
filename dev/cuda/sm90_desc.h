// The fields of a wgmma shared-memory matrix descriptor, plain C++ so that the device code
// (sm90_ptx.cuh) and its CPU simulation (tests/cuda_host_sim_sm90.h) pack them the same way.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define VIT_SM90_HOST_DEVICE __host__ __device__
#else
#define VIT_SM90_HOST_DEVICE
#endif

namespace vit::cuda::sm90 {

// A K-major bf16 operand in the 128-byte swizzle that a TMA box of 64 (K) x rows writes: rows of
// 128 bytes, in atoms of 8 rows (1024 bytes, the stride-dimension offset); the leading-dimension
// offset is unused in this layout (1 by convention). Bits: 0-13 the shared address / 16, 16-29
// leading offset / 16, 32-45 stride offset / 16, 62-63 the swizzle (1: 128 bytes). The atom
// starts 1024-byte aligned (base offset 0); a k-step of 16 elements within it advances the
// address by 32 bytes.
VIT_SM90_HOST_DEVICE constexpr uint64_t desc_k_sw128(uint32_t shared_addr) {
  return ((uint64_t(shared_addr) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// An MN-major bf16 operand (B stored (K, N) row-major: a Linear's weight in the data-gradient
// GEMM) as TMA boxes of 64 (N) x 64 (K) write them with the 128-byte swizzle: each K row holds
// 64 N-contiguous elements (128 bytes); 8 K rows make an atom (1024 bytes, the stride-dimension
// offset, between atoms along K); the next 64 N columns are the next box, 8 KiB on (the
// leading-dimension offset, between atoms along N). A k-step of 16 advances the address by 16
// rows (2048 bytes).
VIT_SM90_HOST_DEVICE constexpr uint64_t desc_mn_sw128(uint32_t shared_addr) {
  return ((uint64_t(shared_addr) & 0x3FFFF) >> 4) | (uint64_t(8192 >> 4) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

}  // namespace vit::cuda::sm90
