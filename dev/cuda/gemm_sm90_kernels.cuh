// The Hopper GEMM kernel (gemm_sm90.cu launches it): C (M, N) = op(A) @ op(B) in bf16 with
// fp32 accumulation, A row-major (M, K) (K-major) and B either (N, K) row-major (a Linear's
// (out, in) weight: the forward, C = A B^T) or (K, N) row-major (the same weight in the
// data-gradient GEMM, C = A B: kTransB, read MN-major); for the weight gradient dW = dY^T X both
// are (K, M) and (K, N) row-major (kTransA, kTransB: the tokens are K), and the fp32 result
// goes to per-split partial sums (kPartial; K is long, the tiles few, so blocks split K). The
// epilogues: the bias, and for fc1 the exact (erf) GELU writing both the rounded pre-activation
// (for the backward) and the activation, one pass where cuBLASLt + the GELU kernel make three; and
// in the backward the GELU's gradient, d(pre) = gelu'(pre) * d(act) with d(act) the product rounded
// to bf16 first, as the separate ops round it, so the fused pass gives their bits.
//
// Block: a 128 x 128 tile of C. Warps 0-7 are two consumer warpgroups (64 rows each, one
// wgmma m64n128k16 per 16 of K); warp 8 is the producer, one thread of which streams 64-wide K
// slices of A and B through kStages shared-memory stages with TMA (128-byte swizzle, the
// layout wgmma reads), each stage guarded by a `full` barrier (the loads' bytes landed) and an
// `empty` one (both warpgroups' wgmmas that read it finished). A warpgroup keeps one wgmma
// group in flight: it waits for the previous slice's group before releasing that slice's
// stage. 288 threads and 96 KiB of stages let two blocks share an SM, so one's epilogue
// overlaps the other's main loop (short K: ViT-S's Linears have K = 384 or 1536).
//
// The grid is persistent: as many blocks as fit on the device at once, each taking the work
// units (C tiles, times the weight gradient's K splits) blockIdx.x, + gridDim.x, ... The stage
// ring runs on across a block's units, so the producer loads the next tile's first slices while
// the consumers run this one's epilogue, and a block's set-up (barriers, the first loads'
// latency) is paid once, not per tile: at ViT-Ti's K = 192 a tile is only three slices.
//
// The primitives (ops/cuda/sm90_ptx.cuh) are the only inline assembly: tests/cuda_host_sim.h
// with tests/cuda_host_sim_sm90.h runs this kernel on the CPU (tests/test_gemm_sm90_on_host.cpp).
#pragma once
#include <cstdint>

#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#include "sm90_ptx.cuh"
#define VIT_GRID_CONSTANT const __grid_constant__
#endif
#include "ops/cuda/activation_math.cuh"

namespace vit::cuda::gemm_sm90 {

using sm90::TensorMap;
#ifndef VIT_CUDA_HOST_SIM
// Two bf16 as one 32-bit word, lo at the lower address.
__device__ __forceinline__ uint32_t pack_pair(bf16 lo, bf16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | uint32_t(__bfloat16_as_ushort(hi)) << 16;
}
#endif

constexpr int kBM = 128, kBN = 128, kBK = 64;  // C tile; K slice (64 bf16 = one 128-byte row)
constexpr int kStages = 3;
constexpr int kConsumerWarps = 8, kThreads = (kConsumerWarps + 1) * 32;
constexpr int kTileA = kBM * kBK, kTileB = kBN * kBK;    // elements of a stage's tiles
constexpr uint32_t kStageBytes = (kTileA + kTileB) * 2;  // 32 KiB
constexpr int kBarrierBytes = 2 * kStages * 8;
// Dynamic shared memory a launch asks for: the stages, the barriers, and room to align to the
// 1024 bytes of a swizzle atom.
constexpr int kColsumBytes = kConsumerWarps * kBN * 4;  // the column sums' per-warp partials
constexpr int kSharedBytes = kStages * int(kStageBytes) + kBarrierBytes + kColsumBytes + 1024;

enum class Epilogue {
  kBias,      // out = A op(B) + bias (bias may be null)
  kBiasGelu,  // pre = A op(B) + bias, out = gelu(pre)
  kGeluGrad,  // out = gelu'(aux) * bf16(A op(B)), aux the GELU's stored input
  kPartial,   // part[z] = A op(B) over split z's share of K, fp32 (the weight gradient)
};

struct Params {
  bf16* out;         // (M, ldc): C, the GELU's activation, or the GELU's input gradient
  bf16* pre;         // (M, ldc): the pre-activation (kBiasGelu only)
  const bf16* aux;   // (M, ldc): the GELU's input (kGeluGrad only)
  const bf16* bias;  // (N) or null
  // (ceil(M / kBM), N) or null (kGeluGrad only): each block's column sums of its rows of out,
  // as stored (bf16), for the bias gradient of the Linear before the GELU
  float* colsum;
  // (splits, M, N) fp32 (kPartial only): split z (Unit::z) sums slices_per_split K slices
  float* part;
  int slices_per_split;  // 0: one split, all of K
  int M, N, K;
  int ldc;  // even (the epilogue stores column pairs as one 32-bit word)
};

// Where a work unit lies: C tile (row block m, column block n) of K split z.
struct Unit {
  int m, n, z;
};

// The K slices in all, and per split.
__host__ __device__ inline int slice_count(const Params& p) {
  return (p.K + kBK - 1) / kBK;
}
__host__ __device__ inline int slices_per_split(const Params& p) {
  return p.slices_per_split > 0 ? p.slices_per_split : slice_count(p);
}
__host__ __device__ inline int row_blocks(const Params& p) {
  return (p.M + kBM - 1) / kBM;
}
__host__ __device__ inline int column_blocks(const Params& p) {
  return (p.N + kBN - 1) / kBN;
}
// The work units: every C tile of every split (the caller keeps the product within an int).
__host__ __device__ inline int unit_count(const Params& p) {
  const int per = slices_per_split(p);
  return row_blocks(p) * column_blocks(p) * ((slice_count(p) + per - 1) / per);
}
// Unit u: the column block fastest, then the row block, then the split, so the blocks resident
// together share A's row blocks (and B, all of it for a Linear's N <= 1536) in L2.
__device__ __forceinline__ Unit unit_at(const Params& p, int u) {
  const int nb = column_blocks(p), mb = row_blocks(p);
  return {(u / nb) % mb, u % nb, u / (nb * mb)};
}

// The pair (row, col), (row, col + 1) of a bf16 matrix, col + 1 < N when `pair`.
__device__ __forceinline__ void load_pair(const bf16* m, int64_t at, bool pair, float& x0,
                                          float& x1) {
  x0 = to_f32(m[at]);
  x1 = pair ? to_f32(m[at + 1]) : 0.0f;
}
__device__ __forceinline__ void store_pair(bf16* m, int64_t at, bool pair, bf16 y0, bf16 y1) {
  if (pair)
    *reinterpret_cast<uint32_t*>(m + at) = pack_pair(y0, y1);
  else
    m[at] = y0;
}

// The first 1024-byte boundary at or after p: where a 128-byte-swizzled tile must start (the
// swizzle reads the address's bits 7-9).
__device__ __forceinline__ unsigned char* swizzle_atom_aligned(unsigned char* p) {
  return p + (1024 - reinterpret_cast<uintptr_t>(p) % 1024) % 1024;
}

struct Pair {
  float x, y;
};

// D(row, col) and D(row, col + 1), from two accumulators, through the epilogue into memory;
// returns the two values out received as stored (zeros outside the matrix).
template <Epilogue kEpi>
__device__ __forceinline__ Pair epilogue_pair(const Params& p, int z, int row, int col, float v0,
                                              float v1, float b0, float b1) {
  if (row >= p.M || col >= p.N) return {0.0f, 0.0f};
  const bool pair = col + 1 < p.N;
  if constexpr (kEpi == Epilogue::kPartial) {  // fp32, N even: the pair is 8-byte aligned
    float* at = p.part + (int64_t(z) * p.M + row) * p.N + col;
    if (pair) {
      *reinterpret_cast<float2*>(at) = make_float2(v0, v1);
    } else {
      at[0] = v0;
    }
    return {v0, v1};
  }
  const int64_t at = int64_t(row) * p.ldc + col;
  bf16 y0 = from_f32<bf16>(v0 + b0), y1 = from_f32<bf16>(v1 + b1);
  if constexpr (kEpi == Epilogue::kBiasGelu) {
    // The activation from the stored pre-activation, as the separate GELU kernel reads it.
    store_pair(p.pre, at, pair, y0, y1);
    y0 = from_f32<bf16>(GeluForward{}(to_f32(y0)));
    y1 = from_f32<bf16>(GeluForward{}(to_f32(y1)));
  } else if constexpr (kEpi == Epilogue::kGeluGrad) {
    float x0, x1;
    load_pair(p.aux, at, pair, x0, x1);
    y0 = from_f32<bf16>(GeluBackward{}(to_f32(y0), x0));
    y1 = from_f32<bf16>(GeluBackward{}(to_f32(y1), x1));
  }
  store_pair(p.out, at, pair, y0, y1);
  return {to_f32(y0), pair ? to_f32(y1) : 0.0f};
}

// The tile's column sums of out, in a fixed order (a thread's two rows, the 8 lanes of a column
// pair by shuffles, then the 8 consumer warps in turn), so reruns give the same bits. First each
// warp's: v, the thread's two rows' sums of its column pair in 8-column group j, into sums'
// row `warp` (sums: (kConsumerWarps, kBN) shared). Called per j as the epilogue goes, so no
// thread holds the 16 pairs at once.
__device__ __forceinline__ void warp_column_sums(float* sums, int j, Pair v, int warp, int lane) {
  for (int o = 4; o < 32; o <<= 1) {  // the lanes of one column pair: lane % 4 alike
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  if (lane < 4) {
    sums[warp * kBN + 8 * j + 2 * lane] = v.x;
    sums[warp * kBN + 8 * j + 2 * lane + 1] = v.y;
  }
}
// Then the warps' sums, in warp order, into p.colsum's row `row_block`.
__device__ __forceinline__ void column_sums(const Params& p, const float* sums, int row_block,
                                            int n0) {
  sm90::sync_consumers(kConsumerWarps * 32);
  const int c = int(threadIdx.x);
  if (c < kBN && n0 + c < p.N) {
    float total = 0.0f;
    for (int w = 0; w < kConsumerWarps; ++w) total += sums[w * kBN + c];
    p.colsum[int64_t(row_block) * p.N + n0 + c] = total;
  }
  sm90::sync_consumers(kConsumerWarps * 32);  // read out before the block's next tile writes
}

// The producer thread: K slice k of A's row block m0 and B's column block n0 into stage s, once
// both warpgroups released it. A (M, K) is one box of kBM rows, A (K, M) (kTransA) two boxes
// of 64 K-rows x 64 columns, one per warpgroup; B (N, K) is one box of kBN rows, B (K, N)
// (kTransB) two such boxes, side by side 8 KiB apart (desc_mn_sw128's leading offset).
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void load_slice(bf16* stage, uint64_t* full, const TensorMap& map_a,
                                           const TensorMap& map_b, int k, int m0, int n0) {
  sm90::mbar_arrive_expect_tx(full, kStageBytes);
  if constexpr (kTransA) {
    sm90::tma_load_2d(stage, &map_a, full, m0, k * kBK);
    sm90::tma_load_2d(stage + 64 * kBK, &map_a, full, m0 + 64, k * kBK);
  } else {
    sm90::tma_load_2d(stage, &map_a, full, k * kBK, m0);
  }
  bf16* b = stage + kTileA;
  if constexpr (kTransB) {
    sm90::tma_load_2d(b, &map_b, full, n0, k * kBK);
    sm90::tma_load_2d(b + 64 * kBK, &map_b, full, n0 + 64, k * kBK);
  } else {
    sm90::tma_load_2d(b, &map_b, full, k * kBK, n0);
  }
}

// One warpgroup's wgmmas over a stage: its 64 rows of A against the stage's B, 16 of K at a
// time (32 bytes along a K-major row; 16 rows, 2 KiB, down an MN-major tile).
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void multiply_slice(float (&acc)[64], const bf16* stage, int group) {
  const bf16* a = stage + group * 64 * kBK;  // the warpgroup's 64 rows: 8 KiB either way
  const bf16* b = stage + kTileA;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    const uint64_t desc_a =
        kTransA ? sm90::smem_desc_mn_sw128(a + kk * 16 * 64) : sm90::smem_desc_k_sw128(a + kk * 16);
    const uint64_t desc_b =
        kTransB ? sm90::smem_desc_mn_sw128(b + kk * 16 * 64) : sm90::smem_desc_k_sw128(b + kk * 16);
    sm90::wgmma_m64n128k16<kTransA ? 1 : 0, kTransB ? 1 : 0>(acc, desc_a, desc_b);
  }
  sm90::wgmma_commit();
}

// The consumers' share of one unit: its slices' wgmmas into acc, from ring position `it` on
// (advanced past them), releasing each stage once its wgmmas have read it, the last one too.
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void multiply_unit(float (&acc)[64], bf16* tiles, uint64_t* full,
                                              uint64_t* empty, int slices, int group, int& it) {
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const bool leader = threadIdx.x % 128 == 0;  // arrives for its warpgroup
  for (int i = 0; i < slices; ++i, ++it) {
    const int s = it % kStages;
    sm90::mbar_wait(&full[s], (it / kStages) & 1);
    multiply_slice<kTransA, kTransB>(acc, tiles + s * (kTileA + kTileB), group);
    sm90::wgmma_wait<1>();  // the previous slice's group is done: its stage is free
    if (i > 0 && leader) sm90::mbar_arrive(&empty[(it - 1) % kStages]);
  }
  sm90::wgmma_wait<0>();
  // the last slice's stage, before the epilogue: the producer fills it with the next unit's
  if (slices > 0 && leader) sm90::mbar_arrive(&empty[(it - 1) % kStages]);
}

// One unit's accumulators through the epilogue into memory (and the column sums' shared
// partials when asked).
template <Epilogue kEpi>
__device__ __forceinline__ void store_unit(const Params& p, const float (&acc)[64], Unit u,
                                           float* sums, int group, int warp, int lane) {
  const int n0 = u.n * kBN;
  const int row = u.m * kBM + group * 64 + (warp % 4) * 16 + lane / 4;
  const bool sum_columns = kEpi == Epilogue::kGeluGrad && p.colsum;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = n0 + 8 * j + 2 * (lane % 4);
    float b0 = 0.0f, b1 = 0.0f;
    if (p.bias && col < p.N) b0 = to_f32(p.bias[col]);
    if (p.bias && col + 1 < p.N) b1 = to_f32(p.bias[col + 1]);
    const Pair top = epilogue_pair<kEpi>(p, u.z, row, col, acc[4 * j], acc[4 * j + 1], b0, b1);
    const Pair low =
        epilogue_pair<kEpi>(p, u.z, row + 8, col, acc[4 * j + 2], acc[4 * j + 3], b0, b1);
    if (sum_columns) warp_column_sums(sums, j, {top.x + low.x, top.y + low.y}, warp, lane);
  }
  if (sum_columns) column_sums(p, sums, u.m, n0);
}

// C (M, N) = op(A) @ op(B) through the epilogue: a 1-D grid of at most unit_count(p) blocks
// (persistent: the launch sizes it to the blocks resident at once), kThreads threads,
// kSharedBytes of dynamic shared memory.
template <Epilogue kEpi, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(VIT_GRID_CONSTANT TensorMap map_a, VIT_GRID_CONSTANT TensorMap map_b, Params p) {
#ifdef VIT_CUDA_HOST_SIM
  unsigned char* raw = ::vit::cuda::sim_dynamic_shared;
#else
  extern __shared__ __align__(1024) unsigned char raw[];
#endif
  // stage s: A tile (kBM, kBK) then B's (kBN x kBK elements), 128-byte rows, swizzled
  unsigned char* base = swizzle_atom_aligned(raw);
  bf16* tiles = reinterpret_cast<bf16*>(base);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&full[s], 1);                    // the producer's expect_tx arrival
      sm90::mbar_init(&empty[s], kConsumerWarps / 4);  // one arrival per consumer warpgroup
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: the producer's idle lanes leave below

  const int units = unit_count(p), all = slice_count(p), per = slices_per_split(p);
  // unit u's K slices: k0 .. k0 + slices - 1
  auto slices_of = [&](const Unit& u) {
    const int k0 = u.z * per;
    return k0 < all ? (all - k0 < per ? all - k0 : per) : 0;
  };
  int it = 0;  // the block's K slices so far, over its units: the stage ring's position
  if (warp == kConsumerWarps) {
    if (lane == 0)
      for (int w = int(blockIdx.x); w < units; w += int(gridDim.x)) {
        const Unit u = unit_at(p, w);
        for (int i = 0, slices = slices_of(u); i < slices; ++i, ++it) {
          const int s = it % kStages;
          sm90::mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);  // the first round passes at once
          load_slice<kTransA, kTransB>(tiles + s * (kTileA + kTileB), &full[s], map_a, map_b,
                                       u.z * per + i, u.m * kBM, u.n * kBN);
        }
      }
    return;
  }

  const int group = warp / 4;  // consumer warpgroup: rows 64 group .. of the tile
  float* sums = reinterpret_cast<float*>(base + kStages * kStageBytes + kBarrierBytes);
  float acc[64];
  for (int w = int(blockIdx.x); w < units; w += int(gridDim.x)) {
    const Unit u = unit_at(p, w);
    multiply_unit<kTransA, kTransB>(acc, tiles, full, empty, slices_of(u), group, it);
    store_unit<kEpi>(p, acc, u, sums, group, warp, lane);
  }
}

}  // namespace vit::cuda::gemm_sm90
