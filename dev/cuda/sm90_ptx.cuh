// Hopper's (sm_90a) asynchronous primitives as device functions, the only inline assembly of
// the wgmma GEMM (gemm_sm90_kernels.cuh): the mbarrier, the tensor-memory-access (TMA) tile load
// that completes on one, and the warpgroup matrix multiply (wgmma) reading both operands from
// shared memory. tests/cuda_host_sim_sm90.h supplies the same functions on the host, so the
// kernel's pipeline, descriptors and fragment layout also run on the CPU in CI.
//
// The instructions exist only for sm_90a (wgmma) or sm_90 (TMA, mbarrier with transaction
// counts); their library is built for sm_90a alone (CMakeLists.txt), and elsewhere the bodies
// trap, which the launcher never reaches (it checks the device's compute capability first).
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>

#include <cstdint>

#include "sm90_desc.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VIT_SM90_UNAVAILABLE() __trap()
#else
#define VIT_SM90_UNAVAILABLE()
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VIT_SM90_ASM 1
#endif

namespace vit::cuda::sm90 {

using TensorMap = CUtensorMap;  // 128 bytes, passed by value as a __grid_constant__ parameter

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// ---- mbarrier: an arrival count plus a transaction (byte) count; a phase completes when both
// reach zero, and waiters name the phase by its parity.

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned arrivals) {
#ifdef VIT_SM90_ASM
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

// Makes the initialised barriers visible to the copy engine (the async proxy) before use.
__device__ __forceinline__ void mbar_init_fence() {
#ifdef VIT_SM90_ASM
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

// One arrival that also announces `bytes` of transactions (the TMA loads of a stage).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef VIT_SM90_ASM
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifdef VIT_SM90_ASM
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

// Blocks until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting on parity 1 returns at once (the producer's first pass over its empty stages).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef VIT_SM90_ASM
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

// A barrier of the consumer warps alone (named barrier 1; the producer warp has left, so
// __syncthreads, barrier 0 over the whole block, would wait for it forever).
__device__ __forceinline__ void sync_consumers(int threads) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory");
}

// ---- TMA: the box at (c0 innermost, c1) of a 2-D tensor map into shared memory (laid out, and
// swizzled, as the map says; out-of-bounds elements are zeros), counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, uint64_t* bar, int c0,
                                            int c1) {
#ifdef VIT_SM90_ASM
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

// ---- wgmma

// The descriptors of a K-major and an MN-major 128-byte-swizzled operand tile at p
// (sm90_desc.h).
__device__ __forceinline__ uint64_t smem_desc_k_sw128(const void* p) {
  return desc_k_sw128(smem_addr(p));
}
__device__ __forceinline__ uint64_t smem_desc_mn_sw128(const void* p) {
  return desc_mn_sw128(smem_addr(p));
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef VIT_SM90_ASM
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef VIT_SM90_ASM
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef VIT_SM90_ASM
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

// d (64 x 128, fp32) += A (64 x 16) B (128 x 16)^T, each operand in shared memory K-major
// (kTrans = 0) or MN-major (kTrans = 1, its descriptor's layout then desc_mn_sw128's), issued by
// a whole warpgroup. Fragment of thread t (warp w = t / 32 % 4, lane l): d[4j + 2h + e] is
// D(16 w + l / 4 + 8 h, 8 j + 2 (l % 4) + e) for j < 16, h, e < 2.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
#ifdef VIT_SM90_ASM
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, %66, %67;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB));
#else
  VIT_SM90_UNAVAILABLE();
#endif
}

}  // namespace vit::cuda::sm90
