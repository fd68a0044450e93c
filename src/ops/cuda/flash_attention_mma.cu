// Launches the mma.sync fused attention kernels of flash_mma_kernels.cuh (the scheme, the
// fragment layouts and the rounding points are described there): bf16 storage only
// (flash_attention.cu dispatches).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "ops/cuda/flash_common.cuh"
#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/flash_mma_fused_kernels.cuh"
#include "ops/cuda/flash_mma_kernels.cuh"
#include "ops/cuda/route_counts.h"

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

// VIT_FLASH_FUSED_BWD=1: the backward in one kernel (flash_mma_fused_kernels.cuh: 5 products
// instead of the two kernels' 7, no recomputation, no scratch) where a block can own all of a
// head's keys: N <= 16 kFusedWarps (208), its shared memory within the device's limit and its
// registers too (block_fits; by its rule 12 warps, N <= 192, at 152 registers, and 13 at 128,
// which reload the key and value fragments per query group: D = 64 spills 24 bytes a thread,
// ptxas, sm_90, against 540 holding them).
// Opt-in until a device times it (one block an SM of ceil(N / 16) warps, against the two
// kernels' 2-4 blocks of up to 4).
bool flash_mma_fused_backward() {
  return env_opt_in("VIT_FLASH_FUSED_BWD");
}

// The most dynamic shared memory a block of this device may opt into; asked once a process, as
// num_sms() is (each fused backward launch asked before: two host queries a layer a step).
size_t max_block_smem() {
  static const size_t limit = [] {
    int dev = 0, bytes = 0;
    VIT_CUDA_CHECK(cudaGetDevice(&dev));
    VIT_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return size_t(bytes);
  }();
  return limit;
}

// Whether a block of `warps` warps with `bytes` of dynamic shared memory can run kKernel on this
// device at all. The registers decide it: an SM's four sub-partitions hold 16,384 each, and a
// block's warps are dealt to them in turn, so 13 warps put 4 on one and may have 128 registers a
// thread, not 65,536 / 416 = 157. The fused backward's 152 launched at 13 warps (N = 197) failed
// with "too many resources requested for launch" on its first device run (H200, 2026-11-28); up
// to 12 warps (N <= 192) may have 168. Asked of the runtime once a (device, warps, bytes).
template <auto kKernel>
bool block_fits(int warps, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, size_t>, bool> known;
  int dev = 0;
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(dev, warps, bytes);
  auto it = known.find(key);
  if (it == known.end()) {
    allow_smem<kKernel>(bytes);
    int blocks = 0;
    VIT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, 32 * warps, bytes));
    it = known.emplace(key, blocks > 0).first;
  }
  return it->second;
}

// f(the fused backward kernel for blocks of `warps` warps, as a std::integral_constant of its
// pointer): kFusedRegisters a thread up to kFusedWideWarps warps, kFusedNarrowRegisters (and the
// fragments reloaded per query group) beyond.
template <int kD, typename F>
void with_fused_kernel(int warps, F&& f) {
  if (warps <= kFusedWideWarps) {
    f(std::integral_constant<decltype(&flash_mma_fused_backward_kernel<kD, kFusedGroups>),
                             &flash_mma_fused_backward_kernel<kD, kFusedGroups>>());
  } else {
    f(std::integral_constant<
        decltype(&flash_mma_fused_backward_kernel<kD, kFusedGroups, kFusedNarrowRegisters, true>),
        &flash_mma_fused_backward_kernel<kD, kFusedGroups, kFusedNarrowRegisters, true>>());
  }
}

// Whether the fused backward takes this N and head dim on this device (VIT_FLASH_FUSED_BWD
// aside): at most kFusedWarps warps of 16 keys, its shared memory within the device's limit, and
// a block of that many warps resident with the kernel's registers.
template <int kD>
bool fused_backward_fits(Index N) {
  if constexpr (kD > 64) {
    // at 96 the dK and dV sums and the keys' and values' fragments alone would be 144 of the
    // kernel's 152 registers a thread
    return false;
  } else {
    const int warps = int((N + 15) / 16);
    if (warps > kFusedWarps) return false;
    const size_t bytes = fused_backward_smem_bytes<kD>(warps);
    bool fits = bytes <= max_block_smem();
    if (fits)
      with_fused_kernel<kD>(
          warps, [&](auto kernel) { fits = block_fits<decltype(kernel)::value>(warps, bytes); });
    return fits;
  }
}

// The fused backward (one block of ceil(N / 16) warps a head) if it fits this N, head dim and
// device; false if not, and nothing is launched.
template <int kD>
bool launch_fused_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                           const float* drow, Index B, Index N, Index H, float scale, bool vec) {
  if constexpr (kD > 64) {
    return false;
  } else {
    if (!fused_backward_fits<kD>(N)) return false;
    const int warps = int((N + 15) / 16);
    const size_t bytes = fused_backward_smem_bytes<kD>(warps);
    row_tiles(B, N, H, warps);  // checks the grid's B * H blocks
    with_fused_kernel<kD>(warps, [&](auto kernel) {
      launch_flash_warps<decltype(kernel)::value>(unsigned(B * H), warps, bytes, dqkv, dout, qkv,
                                                  lse, drow, int(N), int(H), scale, vec);
    });
    return true;
  }
}

}  // namespace

bool flash_mma_fused_backward_takes(Index N, Index D) {
  if (!flash_mma_fused_backward() || (D != 32 && D != 48 && D != 64)) return false;
  bool fits = false;
  with_head_dim(D, [&](auto d) { fits = fused_backward_fits<decltype(d)::value>(N); });
  return fits;
}

void flash_mma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, Index B, Index N, Index H, Index D, bool vec) {
  const float scale = 1.0f / std::sqrt(float(D));
  if (flash_mma_fused_backward()) {
    bool fused = false;
    with_head_dim(D, [&](auto d) {
      fused = launch_fused_backward<decltype(d)::value>(dqkv, dout, qkv, lse, drow, B, N, H, scale,
                                                        vec);
    });
    if (fused) {
      count_route(Route::kFlashFusedBackward);
      return;
    }
  }
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    launch_dkv<kD>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec);
    launch_dq<kD>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec);
  });
}

}  // namespace vit::cuda
