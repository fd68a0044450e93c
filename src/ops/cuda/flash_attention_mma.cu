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

namespace vit::cuda {

using namespace flash_mma_kernels;

namespace {

// VIT_FLASH_WARPS: the warps (16 rows each) of the kernels' blocks: unset or "auto", each
// kernel's choose_block_warps (flash_tiles.cuh) over this GPU's occupancy at the run's N;
// 1 .. kWarps for every kernel. The height never changes a result's bits.
int flash_warps_setting() {  // 0: auto
  const char* env = std::getenv("VIT_FLASH_WARPS");
  if (!env || !*env) return 0;
  const std::string value(env);
  if (value == "auto") return 0;
  char* end = nullptr;
  const long warps = std::strtol(env, &end, 10);
  VIT_CHECK(*end == '\0' && warps >= 1 && warps <= kWarps,
            "VIT_FLASH_WARPS=" + value + ": expected 1 to " + std::to_string(kWarps) + " or auto");
  return int(warps);
}

// The warps of kKernel (`name`, head dim D) blocks at N rows; bytes(warps): its dynamic shared
// memory. The "auto" choice asks the occupancy calculator once per device and N; asked for by
// name (VIT_FLASH_WARPS=auto), it says what it chose on stderr (once), so a benchmark's log shows
// the heights it ran while a training run's stays quiet.
template <auto kKernel, typename Bytes>
int block_warps(const char* name, Index N, Index D, Bytes&& bytes) {
  const int setting = flash_warps_setting();
  if (setting > 0) return setting;
  static thread_local std::unordered_map<Index, int> chosen;  // device << 32 | N -> warps
  int dev = 0;
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  const Index key = (Index(dev) << 32) | N;
  if (const auto it = chosen.find(key); it != chosen.end()) return it->second;
  allow_smem<kKernel>(bytes(kWarps));  // the calculator counts only what may be allowed
  static_assert(kWarps == 4, "the line below names four heights");
  int per_sm[kWarps + 1] = {};
  const int warps = choose_block_warps(N, [&](int w) {
    VIT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[w], kKernel, 32 * w, bytes(w)));
    return Index(per_sm[w]);
  });
  if (const char* env = std::getenv("VIT_FLASH_WARPS"); env && *env)
    std::fprintf(stderr,
                 "vitrain: flash attention %s, N=%lld D=%lld: blocks of %d warps (blocks an SM at "
                 "1/2/3/4 warps: %d/%d/%d/%d)\n",
                 name, (long long)N, (long long)D, warps, per_sm[1], per_sm[2], per_sm[3],
                 per_sm[4]);
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

void flash_mma_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H, Index D,
                       bool vec) {
  const float scale_log2 = kLog2e / std::sqrt(float(D));
  with_head_dim(D, [&](auto head_dim) {
    constexpr int kD = decltype(head_dim)::value;
    constexpr auto kKernel = flash_mma_forward_kernel<kD>;
    const int warps = block_warps<kKernel>("forward", N, kD, forward_smem_bytes<kD>);
    const int tiles = row_tiles(B, N, H, warps);
    launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, forward_smem_bytes<kD>(warps), out,
                                lse, qkv, int(N), int(H), tiles, scale_log2, vec);
  });
}

namespace {

// The dK/dV kernel with its own block height.
template <int kD>
void launch_dkv(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow,
                Index B, Index N, Index H, float scale, bool vec) {
  constexpr auto kKernel = flash_mma_dkv_kernel<kD>;
  const int warps = block_warps<kKernel>("dK/dV", N, kD, dkv_smem_bytes<kD>);
  const int tiles = row_tiles(B, N, H, warps);
  launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, dkv_smem_bytes<kD>(warps), dqkv, dout,
                              qkv, lse, drow, int(N), int(H), tiles, scale, vec);
}

// The dQ kernel that recomputes S, P and dP, with its own block height.
template <int kD>
void launch_dq(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow,
               Index B, Index N, Index H, float scale, bool vec) {
  constexpr auto kKernel = flash_mma_dq_kernel<kD>;
  const int warps = block_warps<kKernel>("dQ", N, kD, dq_smem_bytes<kD>);
  const int tiles = row_tiles(B, N, H, warps);
  launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, dq_smem_bytes<kD>(warps), dqkv, dout,
                              qkv, lse, drow, int(N), int(H), tiles, scale, vec);
}

}  // namespace

void flash_mma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, Index B, Index N, Index H, Index D, bool vec) {
  const float scale = 1.0f / std::sqrt(float(D));
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    launch_dkv<kD>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec);
    launch_dq<kD>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec);
  });
}

}  // namespace vit::cuda
