// The one-kernel flash backward (flash_mma_fused_kernels.cuh: 5 products instead of the two
// kernels' 7, no recomputation, no scratch) where a block can own all of a head's keys: N <= 16
// kFusedWarps (208), its shared memory within the device's limit and its registers too
// (block_fits; by its rule 12 warps, N <= 192, at 152 registers, and 13 at 128, which reload
// the key and value fragments per query group: D = 64 spills 24 bytes a thread, ptxas, sm_90,
// against 540 holding them). An experiment outside vitrain (README.md): the entry points below
// take the same arguments as vitrain's flash_mma_backward, with drow computed by the caller.
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "flash_fused_backward.h"
#include "flash_mma_fused_kernels.cuh"
#include "ops/cuda/flash_common.cuh"

namespace vit::cuda {

using namespace flash_mma_kernels;

namespace {

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
// with "too many resources requested for launch" on its first device run; up
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

// Whether the fused backward takes this N and head dim on this device: at most kFusedWarps warps of
// 16 keys, its shared memory within the device's limit, and a block of that many warps resident
// with the kernel's registers.
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
    VIT_CHECK(B * H < (Index(1) << 31), "flash attention: too many blocks for one grid");
    with_fused_kernel<kD>(warps, [&](auto kernel) {
      launch_flash_warps<decltype(kernel)::value>(unsigned(B * H), warps, bytes, dqkv, dout, qkv,
                                                  lse, drow, int(N), int(H), scale, vec);
    });
    return true;
  }
}

}  // namespace

bool flash_mma_fused_backward_takes(Index N, Index D) {
  if (D != 32 && D != 48 && D != 64) return false;
  bool fits = false;
  with_head_dim(D, [&](auto d) { fits = fused_backward_fits<decltype(d)::value>(N); });
  return fits;
}

bool flash_fused_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                          const float* drow, Index B, Index N, Index H, Index D, bool vec) {
  const float scale = 1.0f / std::sqrt(float(D));
  bool fused = false;
  with_head_dim(D, [&](auto d) {
    fused =
        launch_fused_backward<decltype(d)::value>(dqkv, dout, qkv, lse, drow, B, N, H, scale, vec);
  });
  return fused;
}

}  // namespace vit::cuda
