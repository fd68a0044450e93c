// The Hopper primitives of ops/cuda/sm90_ptx.cuh for tests/cuda_host_sim.h, so the wgmma GEMM
// (ops/cuda/gemm_sm90_kernels.cuh) runs on the CPU: mbarriers with arrival and transaction
// counts and phases (blocking waits; an arrival the barrier does not expect, or a wait that
// never ends, fails the test), the TMA tile load (zeros outside the tensor, the 128-byte swizzle
// on the destination's address bits), the shared-memory descriptor, and wgmma m64n128k16 read
// back through its descriptors (decoded from their bits, so a wrong stride or swizzle field
// reads the wrong elements) into the PTX ISA's accumulator layout. wgmma runs at its issue,
// and wgmma_wait is a barrier of the warpgroup's 128 threads: once any of them passes it, every
// thread's read of the stage is done, as on the device, where the group is one collective
// operation. Sums are fp64 rounded once to fp32 per instruction (the tensor core's order is not
// documented), so results agree with the device's within fp32 summation error.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "cuda_host_sim.h"
#include "sm90_desc.h"

#define VIT_GRID_CONSTANT const

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) {
  return {x, y};
}

namespace vit::cuda {

// Two bf16 as one 32-bit word, lo at the lower address.
inline uint32_t pack_pair(bf16 lo, bf16 hi) {
  return uint32_t(lo.bits) | uint32_t(hi.bits) << 16;
}

namespace sm90 {

// What cuTensorMapEncodeTiled would record for a 2-D bf16 tensor with the 128-byte swizzle.
struct TensorMap {
  const void* base;
  uint64_t cols, rows;    // dims, innermost first
  uint64_t stride_bytes;  // between rows
  uint32_t box_cols, box_rows;
};

[[noreturn]] inline void sim_fail(const char* what) {
  std::fprintf(stderr, "sm90 simulation: %s\n", what);
  std::abort();
}

struct SimMbarrier {
  unsigned expected = 0, pending = 0;
  int64_t tx = 0;
  unsigned phase = 0;  // completed phases
};
inline std::mutex sim_mbar_mutex;
inline std::condition_variable sim_mbar_cv;
inline std::map<const void*, SimMbarrier> sim_mbars;

inline SimMbarrier& sim_mbar(const uint64_t* bar) {
  auto it = sim_mbars.find(bar);
  if (it == sim_mbars.end()) sim_fail("use of an uninitialised mbarrier");
  return it->second;
}
inline void sim_mbar_settle(SimMbarrier& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.expected;
    sim_mbar_cv.notify_all();
  }
}
inline void sim_mbar_arrive(uint64_t* bar, int64_t tx) {
  std::lock_guard<std::mutex> lock(sim_mbar_mutex);
  SimMbarrier& b = sim_mbar(bar);
  if (b.pending == 0) sim_fail("an arrival the mbarrier's phase does not expect");
  b.tx += tx;
  --b.pending;
  sim_mbar_settle(b);
}
inline void sim_mbar_complete_tx(uint64_t* bar, int64_t bytes) {
  std::lock_guard<std::mutex> lock(sim_mbar_mutex);
  SimMbarrier& b = sim_mbar(bar);
  b.tx -= bytes;
  sim_mbar_settle(b);
}

inline void mbar_init(uint64_t* bar, unsigned arrivals) {
  std::lock_guard<std::mutex> lock(sim_mbar_mutex);
  sim_mbars[bar] = SimMbarrier{arrivals, arrivals, 0, 0};
}
inline void mbar_init_fence() {}
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  sim_mbar_arrive(bar, bytes);
}
inline void mbar_arrive(uint64_t* bar) {
  sim_mbar_arrive(bar, 0);
}
inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  std::unique_lock<std::mutex> lock(sim_mbar_mutex);
  SimMbarrier& b = sim_mbar(bar);
  if (!sim_mbar_cv.wait_for(lock, std::chrono::seconds(60),
                            [&] { return (b.phase & 1u) != (parity & 1u); }))
    sim_fail("an mbarrier wait that never completes (deadlock)");
}

// Named barrier 1 of the consumer threads (one count per process: the kernel's 256).
inline void sync_consumers(int threads) {
  static std::barrier<> consumers(threads);
  consumers.arrive_and_wait();
}

// The 128-byte swizzle: the 16-byte chunk bits (4-6) of a shared address XOR its row bits (7-9).
inline uintptr_t sim_swizzle128(uintptr_t addr) {
  return addr ^ (((addr >> 7) & 7u) << 4);
}

inline void tma_load_2d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1) {
  const auto at = reinterpret_cast<uintptr_t>(dst);
  if (at % 1024 != 0) sim_fail("a 128-byte-swizzled TMA box not 1024-byte aligned");
  if (map->box_cols * 2 != 128) sim_fail("a 128-byte swizzle box whose rows are not 128 bytes");
  for (uint32_t r = 0; r < map->box_rows; ++r)
    for (uint32_t c = 0; c < map->box_cols; ++c) {
      const int64_t gr = int64_t(c1) + r, gc = int64_t(c0) + c;
      uint16_t v = 0;
      if (gr >= 0 && gc >= 0 && uint64_t(gr) < map->rows && uint64_t(gc) < map->cols)
        std::memcpy(
            &v, static_cast<const unsigned char*>(map->base) + gr * map->stride_bytes + gc * 2, 2);
      std::memcpy(reinterpret_cast<void*>(sim_swizzle128(at + r * 128 + c * 2)), &v, 2);
    }
  sim_mbar_complete_tx(bar, int64_t(map->box_rows) * map->box_cols * 2);
}

// The device's descriptors (sm90_desc.h) of the offset in the launch's dynamic shared memory:
// the simulation's shared addresses start there, so they fit the field's 18 bits.
inline uint32_t sim_shared_offset(const void* p) {
  return uint32_t(static_cast<const unsigned char*>(p) - ::vit::cuda::sim_dynamic_shared);
}
inline uint64_t smem_desc_k_sw128(const void* p) {
  return desc_k_sw128(sim_shared_offset(p));
}
inline uint64_t smem_desc_mn_sw128(const void* p) {
  return desc_mn_sw128(sim_shared_offset(p));
}

// Element (mn, k) of a 128-byte-swizzled operand of 16 K read through its descriptor: K-major,
// rows of K in atoms of 8 rows `stride` bytes apart; or MN-major, rows of 64 MN-contiguous
// elements, 8 K-rows an atom, atoms `stride` bytes apart along K and `leading` along MN.
inline float sim_desc_element(uint64_t desc, bool mn_major, int mn, int k) {
  if ((desc >> 62) != 1) sim_fail("a descriptor without the 128-byte swizzle");
  const uintptr_t start =
      reinterpret_cast<uintptr_t>(::vit::cuda::sim_dynamic_shared) + ((desc & 0x3FFF) << 4);
  const uintptr_t leading = ((desc >> 16) & 0x3FFF) << 4, stride = ((desc >> 32) & 0x3FFF) << 4;
  const uintptr_t addr = mn_major
                             ? start + uintptr_t(mn / 64) * leading + uintptr_t(k / 8) * stride +
                                   uintptr_t(k % 8) * 128 + uintptr_t(mn % 64) * 2
                             : start + uintptr_t(mn / 8) * stride + uintptr_t(mn % 8) * 128 + k * 2;
  uint16_t bits;
  std::memcpy(&bits, reinterpret_cast<const void*>(sim_swizzle128(addr)), 2);
  return bf16::widen(bits);
}

inline void wgmma_fence() {}
inline void wgmma_commit() {}

// The barrier of the calling thread's warpgroup (threads 128 g .. 128 g + 127 of the block).
inline std::barrier<>& sim_warpgroup_barrier() {
  static std::deque<std::barrier<>> groups = [] {
    std::deque<std::barrier<>> g;
    for (int i = 0; i < 8; ++i) g.emplace_back(128);
    return g;
  }();
  return groups[sim_thread_in_block() / 128];
}
template <int kPending>
void wgmma_wait() {
  sim_warpgroup_barrier().arrive_and_wait();
}

template <int kTransA, int kTransB>
void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  const int t = int(sim_thread_in_block()), warp = t / 32 % 4, lane = t % 32;
  for (int j = 0; j < 16; ++j)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) {
        const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4) + e;
        double sum = d[4 * j + 2 * h + e];
        for (int k = 0; k < 16; ++k)
          sum += double(sim_desc_element(desc_a, kTransA != 0, row, k)) *
                 double(sim_desc_element(desc_b, kTransB != 0, col, k));
        d[4 * j + 2 * h + e] = float(sum);
      }
}

}  // namespace sm90
}  // namespace vit::cuda
