// The PTX primitives of ops/cuda/flash_mma_kernels.cuh for tests/cuda_host_sim.h: ldmatrix,
// mma.sync m16n8k16 (bf16 in, fp32 accumulators) and cp.async, each a warp-wide exchange of the
// lanes' registers with the fragment layouts of the PTX ISA (the kernel header's comment lists
// them). The tensor core's own fp32 summation order is not documented: here each output sums
// its 16 exact bf16 products and the accumulator in fp64, then rounds once to fp32, so results
// agree with the device's and the emulation's within fp32 summation error, not bit for bit.
// cp.async copies at once (wait and commit do nothing): the kernels read a tile only after
// cp_async_wait and __syncthreads, which the simulation honours by being synchronous.
#pragma once
#include <cstdint>
#include <cstring>

#include "cuda_host_sim.h"

namespace vit::cuda {

inline float sim_bf16_half(uint32_t pair, int high) {
  return bf16::widen(uint16_t(high ? pair >> 16 : pair));
}

// Two floats as a bf16 pair (round to nearest even), x in the low half.
inline uint32_t pack_bf16(float x, float y) {
  return uint32_t(bf16::round_bits(x)) | uint32_t(bf16::round_bits(y)) << 16;
}

inline uint32_t sim_bf16_pair(const bf16* lo, const bf16* hi) {
  return uint32_t(lo->bits) | uint32_t(hi->bits) << 16;
}

// Four 8x8 matrices: lanes 8i..8i+7 address matrix i's rows; register i of lane l receives row
// l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i.
inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  sim_warp_exchange({uint64_t(reinterpret_cast<uintptr_t>(p))}, [&](const uint64_t(&s)[32][8]) {
    const int lane = sim_lane(), row = lane / 4, col = 2 * (lane % 4);
    for (int i = 0; i < 4; ++i) {
      const bf16* src = reinterpret_cast<const bf16*>(s[8 * i + row][0]);
      r[i] = sim_bf16_pair(src + col, src + col + 1);
    }
  });
}

// The same, each matrix transposed: register i of lane l receives column l / 4 of rows
// 2 (l % 4) and 2 (l % 4) + 1.
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  sim_warp_exchange({uint64_t(reinterpret_cast<uintptr_t>(p))}, [&](const uint64_t(&s)[32][8]) {
    const int lane = sim_lane(), col = lane / 4, row = 2 * (lane % 4);
    for (int i = 0; i < 4; ++i) {
      const bf16* r0 = reinterpret_cast<const bf16*>(s[8 * i + row][0]);
      const bf16* r1 = reinterpret_cast<const bf16*>(s[8 * i + row + 1][0]);
      r[i] = sim_bf16_pair(r0 + col, r1 + col);
    }
  });
}

// c (16 x 8) += a (16 x 16, row) b (16 x 8, col). With g = lane / 4, t = lane % 4: a[0] holds
// A (g, 2t..2t+1), a[1] (g + 8, 2t..), a[2] (g, 8 + 2t..), a[3] (g + 8, 8 + 2t..); b0 holds
// B (k = 2t..2t+1, n = g), b1 (k = 8 + 2t.., n = g); c[0], c[1] are D (g, 2t..2t+1), c[2], c[3]
// D (g + 8, 2t..).
inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  sim_warp_exchange({a[0], a[1], a[2], a[3], b0, b1}, [&](const uint64_t(&s)[32][8]) {
    auto A = [&](int row, int k) {
      const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
      return sim_bf16_half(uint32_t(s[4 * (row % 8) + (k % 8) / 2][reg]), k % 2);
    };
    auto B = [&](int k, int n) {
      return sim_bf16_half(uint32_t(s[4 * n + (k % 8) / 2][k >= 8 ? 5 : 4]), k % 2);
    };
    const int g = sim_lane() / 4, t = sim_lane() % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), n = 2 * t + e % 2;
      double sum = c[e];
      for (int k = 0; k < 16; ++k) sum += double(A(row, k)) * double(B(k, n));
      c[e] = float(sum);
    }
  });
}

inline void cp_async16(void* dst, const void* src, bool fill) {
  if (fill)
    std::memcpy(dst, src, 16);
  else
    std::memset(dst, 0, 16);
}
inline void cp_async4(void* dst, const void* src, bool fill) {
  if (fill)
    std::memcpy(dst, src, 4);
  else
    std::memset(dst, 0, 4);
}
inline void cp_async_commit() {}
template <int kPending>
void cp_async_wait() {}

}  // namespace vit::cuda
