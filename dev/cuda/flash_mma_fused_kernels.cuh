// The fused attention backward in one kernel for short sequences (N <= 16 kFusedWarps: every
// ViT's 197 tokens at 224 px). vitrain's backward is two kernels: dK/dV
// (a block owns 16-row groups of keys and streams the queries) and dQ (a block owns queries and
// streams the keys), so S, P and dP are formed twice, 7 products where 5 would do; FlashAttention
// -2 forms them once by adding dQ from every key block with atomics, which are not
// deterministic. Here one block owns all the keys of its (b, h), 16 a warp, so every dQ
// contribution is made inside the block: per streamed query tile, each warp forms its keys' dS^T
// as the dK/dV kernel does (the same helper, so dK and dV get that kernel's bits) and writes it
// to a shared (keys, queries) tile; then the block forms the tile's dQ = dS K over all the keys
// from that tile and the keys already in shared memory, in units of 16 queries x 32 (or 16)
// columns dealt to the warps round robin. Each unit sums the keys 16 at a time in ascending order,
// the dQ kernel's chain, so dQ gets its bits. test_flash_fused_on_host.cpp runs this source on
// the CPU against the two kernels.
#pragma once
#include "ops/cuda/flash_mma_kernels.cuh"

namespace vit::cuda::flash_mma_kernels {

// The most warps (16 keys each) a fused block has: N <= 208 (ViTs' 197 tokens at 224 px). Each
// thread has kFusedRegisters. 13 warps x 32 x 152 <= 65,536 was taken to mean that such a block
// runs; it does not (the device says "too many resources requested for launch"): an SM's four
// sub-partitions hold 16,384 registers each and a block's warps are dealt to them in turn, so 13
// warps allow 128 a thread, as a launch bound would have said. There, holding the warp's keys and
// values as A fragments for the whole kernel spills 540 bytes (ptxas, sm_90, D = 64); reloading
// them from shared memory for each query group spills 24 and costs 16 ldmatrix.x4 a tile a warp, a
// quarter more than its products' own. So up to kFusedWideWarps warps (N <= 192: ViT-Ti/4's 65, a
// size curriculum's smaller images) hold them at kFusedRegisters, and 13 (N = 193-208: ViT-S/16 and
// ViT-B/16 at 224 px) reload them at kFusedNarrowRegisters (kReloadKeys), until a device times it;
// the launch asks the runtime whether the block is resident (flash_fused_backward.cu, block_fits)
// and declines if not.
constexpr int kFusedWarps = 13;
constexpr int kFusedWideWarps = 12;
constexpr int kFusedRegisters = 152;
constexpr int kFusedNarrowRegisters = 128;  // reloading, D = 64: 24 bytes spilled (4 with the
                                            // tile's queries in 4 groups, for 2x the reloads)
// The streamed query tile taken kCols / kFusedGroups queries at a time (kGroups of the dK/dV
// kernel: the same bits whatever the grouping): at D = 64, 152 registers and 4 bytes spilled.
constexpr int kFusedGroups = 2;

// The warp's 16 keys of dS^T over the queries [c0, c0 + 16 KK) of the tile (A fragments as
// to_operand packs them: a[kk] rows g, g + 8 by columns kk*16 + 2t, kk*16 + 8 + 2t) into the
// block's shared (rows, ldt) tile sds; keys from N on as zeros (their rows of K are zeros too,
// and the stored-dS path reads them as zeros).
template <int KK>
__device__ __forceinline__ void store_ds_t_shared(bf16* sds, int ldt, int warp, int first, int N,
                                                  int c0, const uint32_t (&a)[KK][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < KK; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = g + (r & 1) * 8;  // the key within the warp's 16
      *reinterpret_cast<uint32_t*>(sds + (warp * 16 + row) * ldt + c0 + kk * 16 + (r >> 1) * 8 +
                                   2 * t) = first + row < N ? a[kk][r] : 0u;
    }
}

// Columns of a dQ unit: 32 where D allows (each dS fragment then feeds four products: 3
// ldmatrix to 4 mma.sync; at D = 64, 8 units a tile for the 13 warps), else 16.
template <int D>
constexpr int kDqUnitCols = D % 32 == 0 ? 32 : 16;

// dQ of a streamed query tile (nv valid queries; dq: its first row, row stride ldg) = dS K over
// the N keys: sds the (keys, kCols queries) dS^T tile, sk the (keys, ld) keys, both shared and
// zero from key N on. Units of 16 queries x kDqUnitCols columns, unit u to warp u % warps; each
// sums the keys 16 at a time in ascending order (key steps wholly past N skipped).
template <int D>
__device__ __forceinline__ void dq_of_query_tile(bf16* dq, int ldg, const bf16* sds, const bf16* sk,
                                                 int N, int nv, bool vec) {
  constexpr int ld = kTileLd<bf16, D>, ldt = kTileLd<bf16, kCols>, kUnit = kDqUnitCols<D>;
  constexpr int kColUnits = D / kUnit;
  const int warp = threadIdx.x / 32, warps = int(blockDim.x) / 32, lane = threadIdx.x % 32;
  const int units = (nv + 15) / 16 * kColUnits;
  for (int u = warp; u < units; u += warps) {
    const int qg = u / kColUnits, c0 = (u % kColUnits) * kUnit;  // its 16 queries, first column
    float acc[kUnit / 8][4] = {};
    for (int k0 = 0; k0 < N; k0 += 16) {
      uint32_t a[4];
      // dS (16 queries x 16 keys): the transposed 8x8 parts of dS^T, as load_ds_fragments
      ldmatrix_x4_trans(
          a, sds + (k0 + lane % 8 + (lane / 16) * 8) * ldt + qg * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int dp = 0; dp < kUnit / 16; ++dp) {
        // K (16 keys x 16 columns), as accumulate_times_tile reads a row-major tile
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, sk + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * ld + c0 + dp * 16 + (lane / 16) * 8);
        mma(acc[2 * dp], a, b[0], b[1]);
        mma(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
    store_acc(dq + (qg * 16) * ldg + c0, ldg, acc, 1.0f, 1.0f, nv - qg * 16, vec);
  }
}

// Dynamic shared memory of a fused block of `warps` warps: the dK/dV kernel's (its keys and
// values, 2 stages of streamed queries, dO and statistics), then the (keys, kCols) dS^T tile.
template <int D>
constexpr size_t fused_backward_smem_bytes(int warps) {
  return dkv_smem_bytes<D>(warps) + size_t(16 * warps) * kTileLd<bf16, kCols> * sizeof(bf16);
}

// kReloadKeys: the warp's key and value fragments read from shared memory for each query group
// (keys_times_query_tile's kReload; the 13-warp build) rather than held for the whole kernel.
template <int D, int kGroups, int kRegisters = kFusedRegisters, bool kReloadKeys = false>
__global__ void __maxnreg__(kRegisters)
    flash_mma_fused_backward_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                    const float* drow, int N, int H, float scale, bool vec) {
  // dq, dk, dv (B, N, D) at columns h*D, C + h*D, 2C + h*D of dqkv (B, N, 3C); block: (b, h),
  // all its keys (ceil(N / 16) warps of 16, launched so); each warp holds its keys' S^T, P^T,
  // dP^T, dS^T over kCols / kGroups queries at a time in registers, as the dK/dV kernel does.
  constexpr int ldt = kTileLd<bf16, kCols>;
  const int rows = block_rows();
  VIT_DYNAMIC_SHARED(smem);
  const KeyBlockTiles<D> sh(smem, rows);
  bf16* sds = reinterpret_cast<bf16*>(sh.end());  // (rows, ldt) dS^T: keys x the tile's queries
  const BlockPos pos(H, 1, rows);
  const int C = H * D, ld3 = 3 * C, warp = threadIdx.x / 32;
  const Head hd(qkv, dout, pos, N, C, D);
  const QueryStats stats(lse, drow, pos.bh, N);
  const float scale_log2 = scale * kLog2e;
  auto load_queries = [&](int i0) { sh.load_queries(hd, stats, i0, N, C, vec); };

  sh.load_keys(hd, 0, rows, N, C, vec);
  load_queries(0);
  cp_async_commit();
  float dk[D / 8][4], dv[D / 8][4];
  zero_acc<D>(dk);
  zero_acc<D>(dv);
  const int first = warp * 16;                                // the warp's first key
  bf16* dq_head = dqkv + Index(pos.b) * N * ld3 + pos.h * D;  // (N, D), row stride 3C

  uint32_t ka[D / 16][4], va[D / 16][4];
  stream_tiles(N, load_queries, [&](int i0) {
    if (!kReloadKeys && i0 == 0) sh.load_key_rows(ka, va, warp);
    const int nv = min(kCols, N - i0);  // valid queries in the tile
    keys_times_query_tile<D, kGroups, kReloadKeys>(
        dk, dv, ka, va, sh, warp, i0, nv, scale_log2, scale,
        [&](int c0, const auto& dsa) { store_ds_t_shared(sds, ldt, warp, first, N, c0, dsa); });
    __syncthreads();  // the tile's whole dS^T is in sds
    dq_of_query_tile<D>(dq_head + Index(i0) * ld3, ld3, sds, sh.sk, N, nv, vec);
  });  // stream_tiles syncs before the next tile's dS^T overwrites sds
  store_dk_dv<D>(dqkv, pos, N, C, first, dk, dv, vec);
}

}  // namespace vit::cuda::flash_mma_kernels
