// Backend runtime: errors, device query, the op stream, scratch memory, type conversion.
#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device.h"

namespace vit::cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA error: ") + cudaGetErrorString(err) + " (" + what + " at " + file +
              ":" + std::to_string(line) + ")");
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later calls
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "0 devices";
  return n;
}

namespace {
cudaStream_t g_stream = nullptr;  // legacy default stream
}  // namespace

cudaStream_t stream() {
  return g_stream;
}
void set_stream(cudaStream_t s) {
  g_stream = s;
}

void synchronize() {
  VIT_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  VIT_CUDA_CHECK(cudaGetLastError());
}

int num_sms() {
  static const int n = [] {
    int dev = 0, sms = 0;
    VIT_CUDA_CHECK(cudaGetDevice(&dev));
    VIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

unsigned grid_stride_blocks(Index n, int block) {
  return std::min(blocks_for(n, block), unsigned(num_sms()) * 8u);
}

namespace {

struct ScratchBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Never destroyed: the driver frees device memory at exit, and a static destructor could run
// after the CUDA runtime has shut down.
struct ScratchArena {
  std::array<ScratchBuf, kScratchSlots> slots;
  std::vector<void*> retired;  // outgrown buffers, freed by release_scratch()
  uint64_t epoch = 0;          // release_scratch() calls that freed something
  std::mutex mu;
};

ScratchArena& arena() {
  static auto* a = new ScratchArena;
  return *a;
}

// Grows slot `b` to at least `bytes` (caller holds the arena lock). The new buffer is allocated
// before the old one is retired, so a failed cudaMalloc leaves the slot as it was.
void grow_locked(ScratchArena& a, ScratchBuf& b, size_t bytes) {
  if (bytes <= b.bytes) return;
  const size_t grown = std::max(bytes, b.bytes + b.bytes / 4);  // amortise slow growth
  a.retired.reserve(a.retired.size() + 1);  // so the push_back below cannot throw
  // Through device_alloc, so the run's reported peak memory counts scratch too (the stored dS is
  // 119 MB at ViT-S/16 b256; timm's max_memory_allocated counts its cuBLAS workspaces).
  void* p = device_alloc(grown);
  // Ops enqueued earlier may still read the old buffer: keep it until release_scratch().
  if (b.ptr) a.retired.push_back(b.ptr);
  b.ptr = p;
  b.bytes = grown;
}

ScratchBuf& slot_buf(ScratchArena& a, int slot) {
  VIT_CHECK(slot >= 0 && slot < kScratchSlots, "cuda::scratch: bad slot");
  return a.slots[size_t(slot)];
}

}  // namespace

void* scratch(size_t bytes, int slot) {
  ScratchArena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  ScratchBuf& b = slot_buf(a, slot);
  grow_locked(a, b, bytes);
  return b.ptr;
}

void reserve_scratch(int slot, size_t bytes) {
  scratch(bytes, slot);
}

void release_scratch() {
  ScratchArena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.retired.empty()) return;
  ++a.epoch;  // before the frees: a graph naming a freed buffer must not be replayed
  std::vector<void*> dead;
  dead.swap(a.retired);  // never freed twice, even if a call below throws
  // Any stream may still have work reading them queued.
  VIT_CUDA_CHECK(cudaDeviceSynchronize());
  for (void* p : dead) device_free(p);
}

uint64_t scratch_epoch() {
  ScratchArena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.epoch;
}

// ---------------------------------------------------------------------------------------------

template <typename TDst, typename TSrc>
__global__ void convert_kernel(TDst* dst, const TSrc* src, Index n) {
  // dst, src (n)
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n;
       i += Index(gridDim.x) * blockDim.x)
    dst[i] = from_f32<TDst>(to_f32(src[i]));
}

template <typename TDst, typename TSrc>
void convert(TDst* dst, const TSrc* src, Index n) {
  if (n <= 0) return;
  convert_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dst, src, n);
  VIT_CUDA_LAUNCHED();
}

template void convert<float, float>(float*, const float*, Index);
template void convert<bf16, float>(bf16*, const float*, Index);
template void convert<float, bf16>(float*, const bf16*, Index);
template void convert<bf16, bf16>(bf16*, const bf16*, Index);

}  // namespace vit::cuda
