// Launches the mma.sync fused attention kernels of flash_mma_kernels.cuh (the scheme, the
// fragment layouts and the rounding points are described there). bf16 storage only; the bf16
// default since a GPU session checked it against the emulation and timed it (H200, 2026-11-26:
// ViT-S/16 b256 1.19x the WMMA kernels' step); VIT_FLASH_MMA=0 picks WMMA (flash_attention.cu
// dispatches).
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

bool flash_mma_enabled() {  // the default since 2026-11-26; VIT_FLASH_MMA=0 picks WMMA
  return env_switch_on("VIT_FLASH_MMA");
}

// cp.async tile loads unless VIT_FLASH_ASYNC=0.
bool flash_mma_async() {
  return env_switch_on("VIT_FLASH_ASYNC");
}

namespace {

// VIT_FLASH_WARPS: the warps (16 rows each) of the kernels' blocks, but the stored-dS dQ
// kernel's: unset or "auto", each kernel's choose_block_warps (flash_tiles.cuh) over this GPU's
// occupancy at the run's N; 1 .. kWarps for every kernel (4: the blocks before 2026-11-27). The
// height never changes a result's bits. Default since an H200's Nsight Compute run (2026-11-27,
// ViT-S/16 b256, with half tiles): dK/dV 348 -> 275 us, dQ 222 -> 190 us.
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
int block_warps(const char* name, Index N, Index D, Bytes&& bytes, int rows_per_warp = 16) {
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
  const int warps = choose_block_warps(
      N,
      [&](int w) {
        VIT_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[w], kKernel, 32 * w, bytes(w)));
        return Index(per_sm[w]);
      },
      rows_per_warp);
  if (const char* env = std::getenv("VIT_FLASH_WARPS"); env && *env)
    std::fprintf(stderr,
                 "vitrain: flash attention %s, N=%lld D=%lld: blocks of %d warps (blocks an SM at "
                 "1/2/3/4 warps: %d/%d/%d/%d)\n",
                 name, (long long)N, (long long)D, warps, per_sm[1], per_sm[2], per_sm[3],
                 per_sm[4]);
  chosen.emplace(key, warps);
  return warps;
}

// A head's blocks of rows_per_warp `warps` rows over N rows (the kernels' `tiles`); the grid they
// make, B * H * tiles, checked against its limit.
int row_tiles(Index B, Index N, Index H, int warps, int rows_per_warp = 16) {
  const Index block = Index(rows_per_warp) * warps, tiles = (N + block - 1) / block;
  VIT_CHECK(B * H * tiles < (Index(1) << 31), "flash attention: too many blocks for one grid");
  return int(tiles);
}

// VIT_FLASH_FWD_ROWS: the forward's rows a warp, 16 (the default) or 32 (two row tiles: each key
// and value fragment feeds twice the products; the same bits, ForwardRowTilesGiveTheSameBits
// passed on the device). Opt-in: its first device run (H200, 2026-11-28, ViT-S/16 b256) had the
// kernel at 204 us against 171 (227 registers, 12% occupancy against 128 and 24%) and the step
// at 0.99x in both rounds.
int flash_forward_row_tiles() {
  const char* env = std::getenv("VIT_FLASH_FWD_ROWS");
  if (!env || !*env) return 1;
  const std::string value(env);
  VIT_CHECK(value == "16" || value == "32", "VIT_FLASH_FWD_ROWS=" + value + ": expected 16 or 32");
  return value == "32" ? 2 : 1;
}

}  // namespace

void flash_mma_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H, Index D,
                       bool vec) {
  const float scale_log2 = kLog2e / std::sqrt(float(D));
  const bool async = flash_mma_async();
  auto run = [&](auto head_dim, auto row_tiles_a_warp) {
    constexpr int kD = decltype(head_dim)::value, kR = decltype(row_tiles_a_warp)::value;
    constexpr auto kKernel = flash_mma_forward_kernel<kD, kR>;
    const int warps = block_warps<kKernel>("forward", N, kD, forward_smem_bytes<kD, kR>, 16 * kR);
    const int tiles = row_tiles(B, N, H, warps, 16 * kR);
    launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, forward_smem_bytes<kD, kR>(warps),
                                out, lse, qkv, int(N), int(H), tiles, scale_log2, vec, async);
  };
  const int row_tiles_a_warp = flash_forward_row_tiles();
  with_head_dim(D, [&](auto d) {
    // two row tiles up to head dim 64 (at 96, 255 registers and 80 bytes spilled: ptxas, sm_90)
    if constexpr (decltype(d)::value <= 64) {
      if (row_tiles_a_warp == 2) {
        count_route(Route::kFlashForwardTwoTiles);
        return run(d, std::integral_constant<int, 2>());
      }
    }
    run(d, std::integral_constant<int, 1>());
  });
}

// VIT_FLASH_STORED_DS=1: the dK/dV kernel stores dS^T (bf16, B * H * N * 64 ceil(N / 64)
// elements of scratch: 119 MB at ViT-S/16 b256) and dQ is formed from it, without the dQ
// kernel's recomputation of S, P and dP (2 of its 3 products and its exponentials). Opt-in
// again after the H200 bench of 2026-11-27's afternoon (bundle f48b072, ViT-S/16 b256, two
// interleaved runs each): over half tiles and `auto` heights the stored dS came last in both
// rounds (7,069-7,147 img/s), the recomputing kernels first (7,518-7,567); the stored dS over
// whole 4-warp tiles (7,319-7,421; in the morning's runs 8,597-8,630, when the recomputing
// kernels over half tiles ran 7,943-8,391) is within the runs' noise of them, and needs the
// scratch. FlashKernelsOnHost checks it gives the recomputing kernel's bits; on the GPU at most
// 1% of dQ differs, by the order of S^T's sums.
bool flash_mma_stored_ds() {
  return env_opt_in("VIT_FLASH_STORED_DS");
}

namespace {

// The backward kernels take each streamed tile's 64 rows 32 at a time (kGroups = 2): the same
// products in the same order, so the same bits, with half the score and dS registers live
// (ptxas, sm_90, D = 64: dK/dV 226 -> 168 a thread, 3 blocks of 4 warps an SM instead of 2; dQ
// 163 -> 128 under its launch bound, 4 instead of 3). VIT_FLASH_HALF_TILES=0: whole tiles.
// Default since the H200's kernel times of 2026-11-27 (above, VIT_FLASH_WARPS); that day's
// bench (f48b072, ViT-S/16 b256): with `auto` heights 7,518-7,567 img/s against 7,187-7,289 for
// whole tiles of 4 warps.
bool flash_mma_half_tiles() {
  return env_switch_on("VIT_FLASH_HALF_TILES");
}

// The dK/dV kernel (storing dS^T to `ds` when kStoreDs) with its own block height.
template <int kD, bool kStoreDs, int kGroups>
void launch_dkv(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow,
                Index B, Index N, Index H, float scale, bool vec, bool async, DsTiles ds) {
  constexpr auto kKernel = flash_mma_dkv_kernel<kD, kStoreDs, kGroups>;
  const int warps = block_warps<kKernel>("dK/dV", N, kD, dkv_smem_bytes<kD>);
  const int tiles = row_tiles(B, N, H, warps);
  launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, dkv_smem_bytes<kD>(warps), dqkv, dout,
                              qkv, lse, drow, int(N), int(H), tiles, scale, vec, async, ds);
}

// The dQ kernel that recomputes S, P and dP, with its own block height.
template <int kD, int kGroups>
void launch_dq(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow,
               Index B, Index N, Index H, float scale, bool vec, bool async) {
  constexpr auto kKernel = flash_mma_dq_kernel<kD, kGroups>;
  const int warps = block_warps<kKernel>("dQ", N, kD, dq_smem_bytes<kD>);
  const int tiles = row_tiles(B, N, H, warps);
  launch_flash_warps<kKernel>(unsigned(B * H * tiles), warps, dq_smem_bytes<kD>(warps), dqkv, dout,
                              qkv, lse, drow, int(N), int(H), tiles, scale, vec, async);
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
                           const float* drow, Index B, Index N, Index H, float scale, bool vec,
                           bool async) {
  if constexpr (kD > 64) {
    return false;
  } else {
    if (!fused_backward_fits<kD>(N)) return false;
    const int warps = int((N + 15) / 16);
    const size_t bytes = fused_backward_smem_bytes<kD>(warps);
    row_tiles(B, N, H, warps);  // checks the grid's B * H blocks
    with_fused_kernel<kD>(warps, [&](auto kernel) {
      launch_flash_warps<decltype(kernel)::value>(unsigned(B * H), warps, bytes, dqkv, dout, qkv,
                                                  lse, drow, int(N), int(H), scale, vec, async);
    });
    return true;
  }
}

}  // namespace

bool flash_mma_fused_backward_takes(Index N, Index D) {
  if (!flash_mma_enabled() || !flash_mma_fused_backward() || (D != 32 && D != 48 && D != 64))
    return false;
  bool fits = false;
  with_head_dim(D, [&](auto d) { fits = fused_backward_fits<decltype(d)::value>(N); });
  return fits;
}

void flash_mma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, Index B, Index N, Index H, Index D, bool vec) {
  const float scale = 1.0f / std::sqrt(float(D));
  const bool async = flash_mma_async(), stored_ds = flash_mma_stored_ds();
  if (flash_mma_fused_backward()) {
    bool fused = false;
    with_head_dim(D, [&](auto d) {
      fused = launch_fused_backward<decltype(d)::value>(dqkv, dout, qkv, lse, drow, B, N, H, scale,
                                                        vec, async);
    });
    if (fused) {
      count_route(Route::kFlashFusedBackward);
      return;
    }
  }
  auto run = [&](auto head_dim, auto groups) {
    constexpr int kD = decltype(head_dim)::value, kGroups = decltype(groups)::value;
    if (!stored_ds) {
      launch_dkv<kD, false, kGroups>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec, async, {});
      launch_dq<kD, kGroups>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec, async);
      return;
    }
    const int tiles = row_tiles(B, N, H, kWarps), ldq = tiles * kCols;
    const DsTiles ds{
        static_cast<bf16*>(scratch(size_t(B * H * N) * ldq * sizeof(bf16), kScratchFlashDs)), ldq};
    launch_dkv<kD, true, kGroups>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec, async, ds);
    launch_flash<flash_mma_dq_stored_kernel<kD>>(unsigned(B * H * tiles),
                                                 dq_stored_smem_bytes<kD>(), dqkv, qkv, ds, int(N),
                                                 int(H), tiles, vec, async);
  };
  with_head_dim(D, [&](auto d) {
    if (flash_mma_half_tiles())
      run(d, std::integral_constant<int, 2>());
    else
      run(d, std::integral_constant<int, 1>());
  });
}

}  // namespace vit::cuda
