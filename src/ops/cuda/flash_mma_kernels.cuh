// The mma.sync fused attention kernels, launched by flash_attention_mma.cu. The PTX primitives
// (ldmatrix, mma.sync, cp.async) are the only inline assembly: tests/cuda_host_sim.h defines
// VIT_CUDA_HOST_SIM and supplies them as host functions over a warp's 32 threads, so the
// kernels' indexing, fragment layouts, masks and tile streaming also run on the CPU in CI
// (tests/test_flash_on_host.cpp).
//
// Fused attention on mma.sync (bf16 m16n8k16, fp32 accumulation), FlashAttention-2 style: each
// warp keeps its 16 rows' scores, probabilities and dS in registers (the accumulator layout of
// one product is the operand layout of the next), so no score tile goes through shared memory,
// unlike the WMMA kernels of flash_attention.cu, whose opaque fragments force that round trip.
// Same blocks (64 rows, 4 warps), same 64-row streamed tiles and the same rounding points as
// those kernels and the CPU emulation (src/ops/emu/flash_attention.cpp): the unnormalised tile
// probabilities rounded to bf16 for P @ V, the running sum over the unrounded ones; dS rounded
// for dQ and dK, P rounded for dV. The streamed tiles are double-buffered through cp.async
// (below).
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//  * A (16 x 16, row): a0a1 (g, 2t..2t+1), a2a3 (g + 8, 2t..), a4a5 (g, 8 + 2t..), a6a7 (g + 8,
//    8 + 2t..); loaded by ldmatrix.x4 with lane l addressing row l % 16, column 8 (l / 16).
//  * B (16 x 8, col): b0b1 (k = 2t..2t+1, n = g), b2b3 (k = 8 + 2t..): for B = Y^T with Y
//    row-major (n, k) a plain ldmatrix of Y's rows; for B = Z with Z row-major (k, n),
//    ldmatrix.trans of Z's rows.
//  * C (16 x 8): c0c1 (g, 2t..2t+1), c2c3 (g + 8, 2t..). Two C tiles side by side (16 columns)
//    are, packed to bf16 pairs, exactly one A fragment: the FA2 register trick.
#pragma once
#ifndef VIT_CUDA_HOST_SIM
#include <cuda_bf16.h>
#endif

#include <cmath>
#include <cstdint>

#include "ops/cuda/flash_tiles.cuh"

namespace vit::cuda::flash_mma_kernels {

using namespace flash;

constexpr int kNT = kCols / 8;  // 8-column C tiles across a streamed 64-row tile

// The rows a block owns (queries, or keys in the dK/dV kernel): 16 per warp, as launched
// (1 .. kWarps warps, the launch bound; flash_attention_mma.cu picks). Every warp computes its 16
// rows over the same streamed tiles whatever the block's height, so the height never changes a
// result's bits.
__device__ __forceinline__ int block_rows() {
  return int(blockDim.x) / 32 * 16;
}

#ifndef VIT_CUDA_HOST_SIM
// ---------------------------------------------------------------------------------------------
// Warp-level primitives

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c (16 x 8 fp32) += a (16 x 16 bf16) b (16 x 8 bf16).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair (round to nearest even), x in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------------------------------------
// Asynchronous tile loads (cp.async, sm_80+). The kernels hold only 2-4 blocks (8-16 warps) per
// SM, too few to hide a synchronous tile load's global latency behind other warps' work, so the
// streamed tiles are double-buffered: the next tile is copied into the second buffer while the
// warps compute on the first. The copies zero-fill rows past `valid` themselves (source size 0,
// nothing read). Operands that are not 16-byte aligned load synchronously into the same
// buffers; both give the same bits.

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(fill ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(fill ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for this thread's copies but the newest kPending groups; __syncthreads() after it makes
// every thread's copies visible to the block.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
#endif  // VIT_CUDA_HOST_SIM

// The A fragments (D / 16 of them) of the warp's 16 rows of the block's (rows, D) shared tile.
template <int D>
__device__ __forceinline__ void load_rows(uint32_t (&a)[D / 16][4], const bf16* tile, int warp) {
  constexpr int ld = kTileLd<bf16, D>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(a[kk], tile + (warp * 16 + lane % 16) * ld + kk * 16 + (lane / 16) * 8);
}

// s (16 x 8 NT, C tiles) = a (16 x D) @ y^T, y the (8 NT, D) shared tile (row-major: a
// streamed tile's rows, or a group of them), whose rows from `ncols` on are padding (zeros): the
// C tiles of only padding columns are left 0 without their products (the callers mask those
// columns). ncols is the same in every lane.
template <int D, int NT>
__device__ __forceinline__ void rows_times_tile_t(float (&s)[NT][4], const uint32_t (&a)[D / 16][4],
                                                  const bf16* y, int ncols) {
  constexpr int ld = kTileLd<bf16, D>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int jp = 0; jp < NT / 2; ++jp) {  // two C tiles (16 rows of y) per ldmatrix.x4
      if (jp * 16 >= ncols) break;
      uint32_t b[4];
      ldmatrix_x4(b,
                  y + (jp * 16 + lane % 8 + (lane / 16) * 8) * ld + kk * 16 + ((lane / 8) % 2) * 8);
      mma(s[2 * jp], a[kk], b[0], b[1]);
      mma(s[2 * jp + 1], a[kk], b[2], b[3]);
    }
  }
}

// acc (16 x D, C tiles) += p (16 x 16 KK, given as A fragments) @ z, z the (16 KK, D) shared
// tile (row-major: a streamed tile, or a group of its rows). Columns of p from `ncols` on are 0
// (masked) and z's rows there are zeros, so their 16-column steps, which would add exact zeros,
// are skipped (ncols: the same in every lane).
template <int D, int KK>
__device__ __forceinline__ void accumulate_times_tile(float (&acc)[D / 8][4],
                                                      const uint32_t (&p)[KK][4], const bf16* z,
                                                      int ncols) {
  constexpr int ld = kTileLd<bf16, D>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    if (kk * 16 >= ncols) break;
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {  // two C tiles (16 columns of z) per ldmatrix.x4
      uint32_t b[4];
      ldmatrix_x4_trans(
          b, z + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * ld + dp * 16 + (lane / 16) * 8);
      mma(acc[2 * dp], p[kk], b[0], b[1]);
      mma(acc[2 * dp + 1], p[kk], b[2], b[3]);
    }
  }
}

// C tiles (16 x 16 KK fp32) rounded to bf16 as A fragments of the next product.
template <int KK>
__device__ __forceinline__ void to_operand(uint32_t (&a)[KK][4], const float (&c)[2 * KK][4]) {
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    a[kk][0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// load_tile (flash_tiles.cuh) of a (rows, D) tile by the whole block, as cp.async copies when
// `vec` allows 16-byte ones, else the synchronous load. valid >= 1 (row 0 stands in as the
// unread source of zero fills).
template <int D>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* g, int ldg, int valid,
                                                bool vec, int rows) {
  const int threads = int(blockDim.x);
  if (!vec) return load_tile<bf16, D>(s, g, ldg, valid, vec, rows, threads);
  constexpr int kChunks = D / 8, ld = kTileLd<bf16, D>;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += threads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const bool inside = r < valid;
    cp_async16(s + r * ld + c, inside ? g + r * ldg + c : g, inside);
  }
}

// s (kCols) = v [0, valid), the rest 0: a streamed tile's per-query statistics.
__device__ __forceinline__ void load_stats_async(float* s, const float* v, int valid) {
  for (int t = threadIdx.x; t < kCols; t += int(blockDim.x))
    cp_async4(s + t, t < valid ? v + t : v, t < valid);
}

// Max / sum over the 4 lanes that share a row (lanes 4g .. 4g + 3).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The tile column of C element e of tile j for this lane (e: 0, 1 row g; 2, 3 row g + 8).
__device__ __forceinline__ int col_of(int j, int e) {
  return j * 8 + 2 * (threadIdx.x % 4) + (e & 1);
}

// g rows [0, 16) (row stride ldg, rows from `valid` on skipped), columns [0, 8 NT) = acc (16 x 8
// NT: C tiles) * the row factor (rows g, g + 8), as bf16.
template <int NT>
__device__ __forceinline__ void store_acc(bf16* g, int ldg, const float (&acc)[NT][4], float f0,
                                          float f8, int valid, bool vec) {
  const int lane = threadIdx.x % 32, r = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = r + 8 * half;
      if (row >= valid) continue;
      const float f = half ? f8 : f0;
      bf16* dst = g + row * ldg + n * 8 + 2 * t;
      const float x = acc[n][2 * half] * f, y = acc[n][2 * half + 1] * f;
      if (vec) {
        *reinterpret_cast<uint32_t*>(dst) = pack_bf16(x, y);
      } else {
        dst[0] = from_f32<bf16>(x);
        dst[1] = from_f32<bf16>(y);
      }
    }
  }
}

template <int D>
__device__ __forceinline__ void zero_acc(float (&acc)[D / 8][4]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// The block's head: q, k, v (N, D) at row stride 3C of qkv (B, N, 3C), and dO (N, D) at row
// stride C of dout (B, N, C) when given.
struct Head {
  const bf16 *q, *k, *v, *dO;
  __device__ Head(const bf16* qkv, const bf16* dout, const BlockPos& pos, int N, int C, int D)
      : q(qkv + Index(pos.b) * N * 3 * C + pos.h * D),
        k(q + C),
        v(q + 2 * C),
        dO(dout ? dout + Index(pos.b) * N * C + pos.h * D : nullptr) {}
};

// The tile pipeline every kernel here runs over the N streamed rows (keys, or queries in the
// dK/dV kernel), double-buffered: the first tile's copies are issued and committed by the caller
// (with the block's own rows); while tile t0 is computed the next one's copies are in flight.
// compute(t0) runs once the whole block sees tile t0, and no stage is refilled before every warp
// is done with it.
template <typename Load, typename Compute>
__device__ __forceinline__ void stream_tiles(int N, Load&& load, Compute&& compute) {
  for (int t0 = 0; t0 < N; t0 += kCols) {
    if (t0 + kCols < N) load(t0 + kCols);  // the next tile streams in meanwhile
    cp_async_commit();
    cp_async_wait<1>();  // this tile (and, the first time, the caller's rows) have landed
    __syncthreads();
    compute(t0);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels

// The online softmax over one streamed key tile (from key j0) for a row tile: s, its scores
// (16 x kCols, C tiles; columns past N masked here), become the tile's unnormalised
// probabilities, rounded to bf16 as the A fragments pa of P @ V; m, l (rows g, g + 8, log2
// units) take the tile, and o is rescaled to the new maxima.
template <int D>
__device__ __forceinline__ void online_softmax_tile(uint32_t (&pa)[kCols / 16][4],
                                                    float (&s)[kNT][4], float (&m)[2],
                                                    float (&l)[2], float (&o)[D / 8][4], int j0,
                                                    int N, float scale_log2) {
  float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = j0 + col_of(j, e) < N ? s[j][e] * scale_log2 : -INFINITY;
      mt[e / 2] = fmaxf(mt[e / 2], s[j][e]);
    }
  float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mn = fmaxf(m[r], quad_max(mt[r]));  // finite: the tile has a valid key
    alpha[r] = exp2f(m[r] - mn);                    // 0 on the first tile
    m[r] = mn;
  }
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = exp2f(s[j][e] - m[e / 2]);  // masked keys: exp2(-inf) = 0
      sum[e / 2] += s[j][e];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(sum[r]);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
  to_operand(pa, s);  // P rounded to bf16: the tensor-core operand
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_mma_forward_kernel(bf16* out, float* lse, const bf16* qkv, int N, int H, int tiles,
                             float scale_log2, bool vec) {
  // qkv (B, N, 3C) -> out (B, N, C), lse (B, H, N); block: (b, h), queries [row0, row0 + rows)
  constexpr int ld = kTileLd<bf16, D>, kTile = kCols * ld;
  const int rows = block_rows();
  VIT_DYNAMIC_SHARED(smem);
  bf16* sq = reinterpret_cast<bf16*>(smem);  // (rows, ld) queries
  bf16* skv = sq + rows * ld;  // 2 stages of [(kCols, ld) keys, (kCols, ld) values] of a tile
  const BlockPos pos(H, tiles, rows);
  const int C = H * D, ld3 = 3 * C, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Head hd(qkv, nullptr, pos, N, C, D);
  const bf16 *q = hd.q, *k = hd.k, *v = hd.v;
  auto stage = [&](int j0) { return skv + ((j0 / kCols) % 2) * 2 * kTile; };
  auto load_kv = [&](int j0) {
    load_tile_async<D>(stage(j0), k + Index(j0) * ld3, ld3, N - j0, vec, kCols);
    load_tile_async<D>(stage(j0) + kTile, v + Index(j0) * ld3, ld3, N - j0, vec, kCols);
  };

  load_tile_async<D>(sq, q + Index(pos.row0) * ld3, ld3, N - pos.row0, vec, rows);
  load_kv(0);
  cp_async_commit();
  uint32_t qa[D / 16][4];
  float o[D / 8][4], m[2], l[2];  // m, l: rows g, g + 8 (log2 units)
  zero_acc<D>(o);
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.0f;

  // A warp whose rows are all past N (e.g. 3 of 4 in the last block at N = 197) loads tiles
  // with the others but computes nothing.
  const int first = pos.row0 + warp * 16;  // the warp's first row
  const bool idle = first >= N;
  stream_tiles(N, load_kv, [&](int j0) {
    if (j0 == 0) load_rows<D>(qa, sq, warp);
    if (!idle) {
      const bf16 *sk = stage(j0), *sv = sk + kTile;
      const int nk = min(kCols, N - j0);  // valid keys in the tile
      float s[kNT][4];
      rows_times_tile_t<D>(s, qa, sk, nk);
      uint32_t pa[kCols / 16][4];
      online_softmax_tile<D>(pa, s, m, l, o, j0, N, scale_log2);
      accumulate_times_tile<D>(o, pa, sv, nk);
    }
  });

  if (idle) return;
  const int g = lane / 4;
  if (lane % 4 == 0) {
    if (first + g < N) lse[Index(pos.bh) * N + first + g] = (m[0] + log2f(l[0])) * kLn2;
    if (first + g + 8 < N) lse[Index(pos.bh) * N + first + g + 8] = (m[1] + log2f(l[1])) * kLn2;
  }
  store_acc(out + (Index(pos.b) * N + first) * C + pos.h * D, C, o, 1.0f / l[0], 1.0f / l[1],
            N - first, vec);
}

// The backward kernels take each streamed 64-row tile kCols / kBackwardGroups rows at a time
// (scores, dS and their operands for a group, then the next): the same products in the same order
// as whole tiles, so the same bits, with half the score and dS registers live (ptxas, sm_90, D =
// 64: dK/dV 226 -> 168 a thread, 3 blocks of 4 warps an SM instead of 2; dQ 163 -> 128 under its
// launch bound, 4 blocks instead of 3).
constexpr int kBackwardGroups = 2;

// Blocks an SM the dQ kernel's launch bound asks ptxas to fit: at head dims up to 64, 4 (128
// registers; at D = 64 4 bytes spilled, against 159 registers and 3 blocks unbounded); else no
// bound: 0, which ptxas takes as none. (The dK/dV kernel would spill ~480 bytes for 4.)
template <int D>
constexpr int dq_min_blocks() {
  return D <= 64 ? 4 : 0;
}

template <int D>
__global__ void __launch_bounds__(kThreads, dq_min_blocks<D>())
    flash_mma_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, int N, int H, int tiles, float scale, bool vec) {
  // dq (B, N, D) at column h*D of dqkv (B, N, 3C); block: (b, h), queries [row0, row0 + rows)
  constexpr int ld = kTileLd<bf16, D>, kTile = kCols * ld, kGroupCols = kCols / kBackwardGroups;
  static_assert(kGroupCols % 16 == 0, "a group is whole 16-column steps");
  const int rows = block_rows();
  VIT_DYNAMIC_SHARED(smem);
  bf16* sq = reinterpret_cast<bf16*>(smem);  // (rows, ld) queries
  bf16* sdo = sq + rows * ld;                // (rows, ld) dO
  bf16* skv = sdo + rows * ld;  // 2 stages of [(kCols, ld) keys, (kCols, ld) values] of a tile
  const BlockPos pos(H, tiles, rows);
  const int C = H * D, ld3 = 3 * C, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Head hd(qkv, dout, pos, N, C, D);
  const bf16 *q = hd.q, *k = hd.k, *v = hd.v, *dO = hd.dO;
  const float scale_log2 = scale * kLog2e;
  auto stage = [&](int j0) { return skv + ((j0 / kCols) % 2) * 2 * kTile; };
  auto load_kv = [&](int j0) {
    load_tile_async<D>(stage(j0), k + Index(j0) * ld3, ld3, N - j0, vec, kCols);
    load_tile_async<D>(stage(j0) + kTile, v + Index(j0) * ld3, ld3, N - j0, vec, kCols);
  };

  load_tile_async<D>(sq, q + Index(pos.row0) * ld3, ld3, N - pos.row0, vec, rows);
  load_tile_async<D>(sdo, dO + Index(pos.row0) * C, C, N - pos.row0, vec, rows);
  load_kv(0);
  cp_async_commit();
  const int first = pos.row0 + warp * 16, g = lane / 4;
  float lse2[2], dr[2];  // rows g, g + 8; rows past N: any finite value (never written)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = first + g + 8 * r;
    lse2[r] = row < N ? lse[Index(pos.bh) * N + row] * kLog2e : 0.0f;
    dr[r] = row < N ? drow[Index(pos.bh) * N + row] : 0.0f;
  }
  uint32_t qa[D / 16][4], da[D / 16][4];
  float dq[D / 8][4];
  zero_acc<D>(dq);
  const bool idle = first >= N;  // all 16 rows past N: load tiles, compute nothing

  stream_tiles(N, load_kv, [&](int j0) {
    if (j0 == 0) {
      load_rows<D>(qa, sq, warp);
      load_rows<D>(da, sdo, warp);
    }
    if (!idle) {
      const bf16 *sk = stage(j0), *sv = sk + kTile;
      const int nk = min(kCols, N - j0);  // valid keys in the tile
#pragma unroll
      for (int group = 0; group < kBackwardGroups; ++group) {  // the tile's keys a group at a time
        const int c0 = group * kGroupCols, ng = nk - c0;  // the group's valid keys (may be <= 0)
        const bf16 *gk = sk + c0 * ld, *gv = sv + c0 * ld;
        float s[kGroupCols / 8][4], dp[kGroupCols / 8][4];
        rows_times_tile_t<D>(s, qa, gk, ng);   // S = Q K^T
        rows_times_tile_t<D>(dp, da, gv, ng);  // dP = dO V^T
#pragma unroll
        for (int j = 0; j < kGroupCols / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p =
                j0 + c0 + col_of(j, e) < N ? exp2f(s[j][e] * scale_log2 - lse2[e / 2]) : 0.0f;
            s[j][e] = p * (dp[j][e] - dr[e / 2]) * scale;  // dS, rounded by to_operand
          }
        uint32_t dsa[kGroupCols / 16][4];
        to_operand(dsa, s);
        accumulate_times_tile<D>(dq, dsa, gk, ng);  // dQ += dS K
      }
    }
  });
  store_acc(dqkv + (Index(pos.b) * N + first) * ld3 + pos.h * D, ld3, dq, 1.0f, 1.0f, N - first,
            vec);
}

// The dK/dV kernels' work on one group of a streamed query tile (kGroupCols queries from column
// c0 of the (kCols, ld) tiles sq, sdo and their statistics slse, sdr; nv valid queries in the
// tile) for the warp's 16 keys (A fragments ka, va of K and V): S^T = K Q^T and dP^T = V dO^T,
// then P^T and dS^T (rounded to bf16 A fragments), dV += P^T dO and dK += dS^T Q. dS^T is
// returned in dsa for the callers that also need it.
template <int D, int kGroupCols>
__device__ __forceinline__ void keys_times_query_group(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                                       uint32_t (&dsa)[kGroupCols / 16][4],
                                                       const uint32_t (&ka)[D / 16][4],
                                                       const uint32_t (&va)[D / 16][4],
                                                       const bf16* sq, const bf16* sdo,
                                                       const float* slse, const float* sdr, int c0,
                                                       int nv, float scale_log2, float scale) {
  static_assert(kGroupCols % 16 == 0, "a group is whole 16-column steps");
  constexpr int ld = kTileLd<bf16, D>;
  const int ng = nv - c0;  // the group's valid queries (may be <= 0)
  const bf16 *gq = sq + c0 * ld, *gdo = sdo + c0 * ld;
  float st[kGroupCols / 8][4], dpt[kGroupCols / 8][4];
  rows_times_tile_t<D>(st, ka, gq, ng);    // S^T = K Q^T
  rows_times_tile_t<D>(dpt, va, gdo, ng);  // dP^T = V dO^T
#pragma unroll
  for (int j = 0; j < kGroupCols / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = c0 + col_of(j, e);  // the query
      // lse in log2 units, the product rounded on its own (no fma with the score's)
      const float p = i < nv ? exp2f(st[j][e] * scale_log2 - __fmul_rn(slse[i], kLog2e)) : 0.0f;
      st[j][e] = p;                                  // P^T, rounded by to_operand
      dpt[j][e] = p * (dpt[j][e] - sdr[i]) * scale;  // dS^T, rounded by to_operand
    }
  uint32_t pa[kGroupCols / 16][4];
  to_operand(pa, st);
  to_operand(dsa, dpt);
  accumulate_times_tile<D>(dv, pa, gdo, ng);  // dV += P^T dO
  accumulate_times_tile<D>(dk, dsa, gq, ng);  // dK += dS^T Q
}

// The per-query statistics of the block's head: lse and Drow (B, H, N) from row bh * N.
struct QueryStats {
  const float *lse, *drow;  // (N) each
  __device__ QueryStats(const float* lse_all, const float* drow_all, int bh, int N)
      : lse(lse_all + Index(bh) * N), drow(drow_all + Index(bh) * N) {}
};

// The dK/dV kernels' shared memory (flash_mma_dkv_kernel, flash_mma_fused_backward_kernel): the
// block's (rows, ld) keys and values, then 2 stages of [(kCols, ld) queries, (kCols, ld) dO] and
// of [(kCols) lse, Drow] of the streamed query tiles; end() is where a kernel's own tiles go.
template <int D>
struct KeyBlockTiles {
  static constexpr int ld = kTileLd<bf16, D>, kTile = kCols * ld;
  bf16 *sk, *sv, *sqd;
  float* sstat;
  __device__ KeyBlockTiles(unsigned char* smem, int rows)
      : sk(reinterpret_cast<bf16*>(smem)),
        sv(sk + rows * ld),
        sqd(sv + rows * ld),
        sstat(reinterpret_cast<float*>(sqd + 4 * kTile)) {}
  __device__ static int stage(int i0) { return (i0 / kCols) % 2; }
  __device__ bf16* queries(int i0) const { return sqd + stage(i0) * 2 * kTile; }
  __device__ bf16* dO(int i0) const { return queries(i0) + kTile; }
  __device__ float* lse(int i0) const { return sstat + stage(i0) * 2 * kCols; }
  __device__ float* drow(int i0) const { return lse(i0) + kCols; }
  __device__ unsigned char* end() const {
    return reinterpret_cast<unsigned char*>(sstat + 4 * kCols);
  }
  // Issues the copies of the block's keys and values [row0, row0 + rows) of the head.
  __device__ void load_keys(const Head& hd, int row0, int rows, int N, int C, bool vec) const {
    const int ld3 = 3 * C;
    load_tile_async<D>(sk, hd.k + Index(row0) * ld3, ld3, N - row0, vec, rows);
    load_tile_async<D>(sv, hd.v + Index(row0) * ld3, ld3, N - row0, vec, rows);
  }
  // Issues the copies of the query tile from row i0: queries, dO and their statistics.
  __device__ void load_queries(const Head& hd, const QueryStats& stats, int i0, int N, int C,
                               bool vec) const {
    const int ld3 = 3 * C;
    load_tile_async<D>(queries(i0), hd.q + Index(i0) * ld3, ld3, N - i0, vec, kCols);
    load_tile_async<D>(dO(i0), hd.dO + Index(i0) * C, C, N - i0, vec, kCols);
    load_stats_async(lse(i0), stats.lse + i0, N - i0);
    load_stats_async(drow(i0), stats.drow + i0, N - i0);
  }
  // The A fragments of the warp's 16 keys and values.
  __device__ void load_key_rows(uint32_t (&ka)[D / 16][4], uint32_t (&va)[D / 16][4],
                                int warp) const {
    load_rows<D>(ka, sk, warp);
    load_rows<D>(va, sv, warp);
  }
};

// The dK/dV kernels' work on the streamed query tile from row i0 (nv valid queries) in sh,
// kCols / kGroups queries at a time (keys_times_query_group) for the warp's keys and values as
// A fragments ka, va; with_ds(c0, dsa) then takes each group's dS^T (the group's first column,
// its A fragments). kReload: ka and va are read from sh for each group here rather than held by
// the caller across the kernel (16 ldmatrix.x4 more a tile a warp at D = 64, 32 registers fewer:
// the fused backward's 13-warp build); the same fragments, so the same bits.
template <int D, int kGroups, bool kReload = false, typename WithDs>
__device__ __forceinline__ void keys_times_query_tile(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                                      uint32_t (&ka)[D / 16][4],
                                                      uint32_t (&va)[D / 16][4],
                                                      const KeyBlockTiles<D>& sh, int warp, int i0,
                                                      int nv, float scale_log2, float scale,
                                                      WithDs&& with_ds) {
  constexpr int kGroupCols = kCols / kGroups;
#pragma unroll
  for (int group = 0; group < kGroups; ++group) {  // the tile's queries a group at a time
    const int c0 = group * kGroupCols;
    if constexpr (kReload) sh.load_key_rows(ka, va, warp);
    uint32_t dsa[kGroupCols / 16][4];
    keys_times_query_group<D, kGroupCols>(dk, dv, dsa, ka, va, sh.queries(i0), sh.dO(i0),
                                          sh.lse(i0), sh.drow(i0), c0, nv, scale_log2, scale);
    with_ds(c0, dsa);
  }
}

// The warp's dK and dV rows (its 16 keys from `first`; those from N on skipped) into their
// columns C + h*D and 2C + h*D of dqkv (B, N, 3C).
template <int D>
__device__ __forceinline__ void store_dk_dv(bf16* dqkv, const BlockPos& pos, int N, int C,
                                            int first, const float (&dk)[D / 8][4],
                                            const float (&dv)[D / 8][4], bool vec) {
  const int ld3 = 3 * C;
  bf16* dk_out = dqkv + (Index(pos.b) * N + first) * ld3 + C + pos.h * D;
  store_acc(dk_out, ld3, dk, 1.0f, 1.0f, N - first, vec);
  store_acc(dk_out + C, ld3, dv, 1.0f, 1.0f, N - first, vec);
}

// kBackwardGroups: as in flash_mma_dq_kernel, over the streamed tile's queries.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_mma_dkv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                         const float* drow, int N, int H, int tiles, float scale, bool vec) {
  // dk, dv (B, N, D) at columns C + h*D, 2C + h*D of dqkv (B, N, 3C); block: (b, h), keys
  // [row0, row0 + rows); each warp holds the transposed tiles S^T, P^T, dP^T, dS^T (16 keys x
  // kCols / kGroups queries) in registers.
  const int rows = block_rows();
  VIT_DYNAMIC_SHARED(smem);
  const KeyBlockTiles<D> sh(smem, rows);
  const BlockPos pos(H, tiles, rows);
  const int C = H * D, warp = threadIdx.x / 32;
  const Head hd(qkv, dout, pos, N, C, D);
  const QueryStats stats(lse, drow, pos.bh, N);
  const float scale_log2 = scale * kLog2e;
  auto load_queries = [&](int i0) { sh.load_queries(hd, stats, i0, N, C, vec); };

  sh.load_keys(hd, pos.row0, rows, N, C, vec);
  load_queries(0);
  cp_async_commit();
  uint32_t ka[D / 16][4], va[D / 16][4];
  float dk[D / 8][4], dv[D / 8][4];
  zero_acc<D>(dk);
  zero_acc<D>(dv);
  const int first = pos.row0 + warp * 16;  // the warp's first key
  const bool idle = first >= N;            // all 16 keys past N: load, compute nothing

  stream_tiles(N, load_queries, [&](int i0) {
    if (i0 == 0) sh.load_key_rows(ka, va, warp);
    if (idle) return;
    keys_times_query_tile<D, kBackwardGroups>(dk, dv, ka, va, sh, warp, i0, min(kCols, N - i0),
                                              scale_log2, scale, [](int, const auto&) {});
  });
  store_dk_dv<D>(dqkv, pos, N, C, first, dk, dv, vec);
}

// Bytes of a (rows, D) shared tile.
template <int D>
constexpr size_t tile_bytes(int rows = kCols) {
  return size_t(rows) * kTileLd<bf16, D> * sizeof(bf16);
}

// Dynamic shared memory of each kernel with blocks of `warps` warps: forward: queries, 2 x
// (keys, values); dq: queries, dO, 2 x (keys, values); dkv: keys, values, 2 x (queries, dO, lse,
// Drow); the block's own rows 16 a warp, the streamed tiles kCols.
template <int D>
constexpr size_t forward_smem_bytes(int warps = kWarps) {
  return tile_bytes<D>(16 * warps) + 4 * tile_bytes<D>();
}
template <int D>
constexpr size_t dq_smem_bytes(int warps = kWarps) {
  return 2 * tile_bytes<D>(16 * warps) + 4 * tile_bytes<D>();
}
template <int D>
constexpr size_t dkv_smem_bytes(int warps = kWarps) {
  return 2 * tile_bytes<D>(16 * warps) + 4 * tile_bytes<D>() + 4 * kCols * sizeof(float);
}
}  // namespace vit::cuda::flash_mma_kernels
