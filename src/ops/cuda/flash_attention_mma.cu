// Launches the mma.sync fused attention kernels of flash_mma_kernels.cuh (the scheme, the
// fragment layouts and the rounding points are described there): bf16 storage only
// (flash_attention.cu dispatches).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "ops/cuda/flash_common.cuh"
#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/flash_mma_kernels.cuh"
#include "ops/cuda/plan_timing.cuh"

namespace vit::cuda {

using namespace flash_mma_kernels;

namespace {

// The warps (16 rows each) of kKernel's (head dim D) blocks at N rows: `planned` (the kernel
// plan's flash family: forced by --kernels flash_warps or picked by the autotuner), or where it
// is 0 choose_block_warps (flash_tiles.cuh) over this GPU's occupancy, asked once per device and
// N. bytes(warps): the kernel's dynamic shared memory. The height never changes a result's bits.
template <auto kKernel, typename Bytes>
int block_warps(int planned, Index N, Bytes&& bytes) {
  if (planned > 0) return planned;
  static thread_local std::unordered_map<Index, int> chosen;  // device << 32 | N -> warps
  int dev = 0;
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  const Index key = (Index(dev) << 32) | N;
  if (const auto it = chosen.find(key); it != chosen.end()) return it->second;
  allow_smem<kKernel>(bytes(kWarps));  // the calculator counts only what may be allowed
  const int warps = choose_block_warps(N, [&](int w) {
    int per_sm = 0;
    VIT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, 32 * w, bytes(w)));
    return Index(per_sm);
  });
  chosen.emplace(key, warps);
  return warps;
}

// A head's blocks of 16 `warps` rows over N rows (the kernels' `tiles`); the grid they make,
// B * H * tiles, checked against its limit.
int row_tiles(Index B, Index N, Index H, int warps) {
  const Index block = Index(16) * warps, tiles = (N + block - 1) / block;
  VIT_CHECK(B * H * tiles < (Index(1) << 31), "flash attention: too many blocks for one grid");
  return int(tiles);
}

}  // namespace

// out (B, N, C) and lse (B, H, N) are overwritten: the autotuner may time the heights here.
void flash_mma_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H, Index D,
                       bool vec) {
  const float scale_log2 = kLog2e / std::sqrt(float(D));
  auto run = [&](const KernelChoice& choice) {
    with_head_dim(D, [&](auto head_dim) {
      constexpr int kD = decltype(head_dim)::value;
      constexpr auto kKernel = flash_mma_forward_kernel<kD>;
      const int warps = block_warps<kKernel>(choice.param, N, forward_smem_bytes<kD>);
      const int tiles = row_tiles(B, N, H, warps);
      launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, forward_smem_bytes<kD>(warps),
                                  out, lse, qkv, int(N), int(H), tiles, scale_log2, vec);
    });
  };
  run(tuned_choice(attention_key(OpFamily::kFlashForward, B, N, H, D, Storage::kBf16), run));
}

namespace {

// The dK/dV kernel with its own block height.
template <int kD>
void launch_dkv(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow,
                Index B, Index N, Index H, float scale, bool vec, int planned) {
  constexpr auto kKernel = flash_mma_dkv_kernel<kD>;
  const int warps = block_warps<kKernel>(planned, N, dkv_smem_bytes<kD>);
  const int tiles = row_tiles(B, N, H, warps);
  launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, dkv_smem_bytes<kD>(warps), dqkv, dout,
                              qkv, lse, drow, int(N), int(H), tiles, scale, vec);
}

// The dQ kernel that recomputes S, P and dP, with its own block height.
template <int kD>
void launch_dq(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow,
               Index B, Index N, Index H, float scale, bool vec, int planned) {
  constexpr auto kKernel = flash_mma_dq_kernel<kD>;
  const int warps = block_warps<kKernel>(planned, N, dq_smem_bytes<kD>);
  const int tiles = row_tiles(B, N, H, warps);
  launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, dq_smem_bytes<kD>(warps), dqkv, dout,
                              qkv, lse, drow, int(N), int(H), tiles, scale, vec);
}

}  // namespace

// dqkv (B, N, 3C) is overwritten (drow only read): the autotuner may time the heights here.
void flash_mma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, Index B, Index N, Index H, Index D, bool vec) {
  const float scale = 1.0f / std::sqrt(float(D));
  auto run = [&](const KernelChoice& choice) {
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      launch_dkv<kD>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec, choice.param);
      launch_dq<kD>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec, choice.param);
    });
  };
  run(tuned_choice(attention_key(OpFamily::kFlashBackward, B, N, H, D, Storage::kBf16), run));
}

}  // namespace vit::cuda
