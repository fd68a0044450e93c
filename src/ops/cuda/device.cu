// Device memory, transfers, the pinned input path and the loss bookkeeping (device.h).
#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

#include <cublasLt.h>

#include "core/parallel_copy.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/device.h"

namespace vit::cuda {

namespace {
std::atomic<size_t> g_in_use{0}, g_peak{0};
std::mutex g_sizes_mu;

struct Sized {
  void* p;
  size_t bytes;
};
std::vector<Sized>& sizes() {  // live allocations (few: the model's buffers, not per op)
  static std::vector<Sized> v;
  return v;
}
}  // namespace

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error("CUDA: cannot allocate " + std::to_string(bytes >> 20) + " MiB of device memory (" +
                cudaGetErrorString(err) + "); use a smaller --batch-size");
  }
  std::lock_guard<std::mutex> lock(g_sizes_mu);
  sizes().push_back({p, bytes});
  const size_t now = g_in_use += bytes;
  if (now > g_peak) g_peak = now;
  return p;
}

void device_free(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(g_sizes_mu);
    auto& v = sizes();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].p == p) {
        g_in_use -= v[i].bytes;
        v[i] = v.back();
        v.pop_back();
        break;
      }
  }
  cudaFree(p);  // never throws from a destructor; a sticky error surfaces at the next check
}

size_t device_bytes_in_use() {
  return g_in_use;
}
size_t device_peak_bytes() {
  return g_peak;
}

void zero_bytes(void* dst, size_t bytes) {
  if (bytes) VIT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}
void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes) VIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}
namespace {
// Pinned staging for upload_bytes: two buffers used in turn, each with the event of its last
// copy, so an upload never waits for the compute queued before it (only for the copy two
// uploads back).
struct Staging {
  void* pinned = nullptr;
  size_t bytes = 0;
  cudaEvent_t copied = nullptr;
};
}  // namespace

void upload_bytes(void* dst, const void* host, size_t bytes) {
  if (!bytes) return;
  static Staging ring[2];
  static int next = 0;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  Staging& s = ring[next];
  next ^= 1;
  if (!s.copied) VIT_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  VIT_CUDA_CHECK(cudaEventSynchronize(s.copied));
  if (bytes > s.bytes) {  // grows at the first uploads (parameters), then stays
    if (s.pinned) VIT_CUDA_CHECK(cudaFreeHost(s.pinned));
    s.pinned = nullptr;
    s.bytes = 0;
    VIT_CUDA_CHECK(cudaMallocHost(&s.pinned, bytes));
    s.bytes = bytes;
  }
  std::memcpy(s.pinned, host, bytes);
  VIT_CUDA_CHECK(cudaMemcpyAsync(dst, s.pinned, bytes, cudaMemcpyHostToDevice, stream()));
  VIT_CUDA_CHECK(cudaEventRecord(s.copied, stream()));
}
void download_bytes(void* host, const void* src, size_t bytes) {
  if (!bytes) return;
  VIT_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream()));
  synchronize();
}

// ---------------------------------------------------------------------------------------------
// The input path: two pinned host buffers, a side stream and three events per slot.

namespace {
struct InputSlot {
  void* pinned = nullptr;  // page-locked host memory, so cudaMemcpyAsync is truly async
  size_t bytes = 0;
  cudaEvent_t copied = nullptr;    // side stream: the copy out of `pinned` has finished
  cudaEvent_t released = nullptr;  // op stream: the device buffer has been read
};
struct InputPath {
  cudaStream_t side = nullptr;
  InputSlot slots[2];
  InputPath() {
    VIT_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (auto& s : slots) {
      VIT_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
      VIT_CUDA_CHECK(cudaEventCreateWithFlags(&s.released, cudaEventDisableTiming));
    }
  }
};
InputPath& input_path() {
  static InputPath p;  // lives until exit (the driver frees it)
  return p;
}
}  // namespace

void upload_input(const InputCopy* copies, int n, int slot) {
  VIT_CHECK(slot == 0 || slot == 1, "cuda::upload_input: slot must be 0 or 1");
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += copies[i].bytes;
  if (!bytes) return;
  InputPath& in = input_path();
  InputSlot& s = in.slots[slot];
  // The previous copy out of this pinned buffer must be done before it is overwritten.
  VIT_CUDA_CHECK(cudaEventSynchronize(s.copied));
  if (bytes > s.bytes) {  // grows at the first batches only (the largest size comes first)
    if (s.pinned) VIT_CUDA_CHECK(cudaFreeHost(s.pinned));
    s.pinned = nullptr;
    s.bytes = 0;
    VIT_CUDA_CHECK(cudaMallocHost(&s.pinned, bytes));
    s.bytes = bytes;
  }
  VIT_CUDA_CHECK(cudaStreamWaitEvent(in.side, s.released, 0));
  auto* staged = static_cast<std::byte*>(s.pinned);
  for (int i = 0; i < n; ++i) {
    const InputCopy& c = copies[i];
    if (!c.bytes) continue;
    parallel_copy(staged, c.host, c.bytes);  // one thread's copy is as long as a step
    VIT_CUDA_CHECK(cudaMemcpyAsync(c.dst, staged, c.bytes, cudaMemcpyHostToDevice, in.side));
    staged += c.bytes;
  }
  VIT_CUDA_CHECK(cudaEventRecord(s.copied, in.side));
  VIT_CUDA_CHECK(cudaStreamWaitEvent(stream(), s.copied, 0));
}

void input_released(int slot) {
  VIT_CHECK(slot == 0 || slot == 1, "cuda::input_released: slot must be 0 or 1");
  VIT_CUDA_CHECK(cudaEventRecord(input_path().slots[slot].released, stream()));
}

// ---------------------------------------------------------------------------------------------
// Loss bookkeeping: one block, fp64, deterministic.

namespace {
__global__ void loss_accumulate_kernel(double* stats, const float* losses, Index B) {
  // stats (kNumStepStats) fp64; losses (B) fp32. One block of 256 threads, fixed-order tree sum.
  __shared__ double smem[32];
  double s = 0;
  for (Index i = threadIdx.x; i < B; i += blockDim.x) s += double(losses[i]);
  s = block_sum(s, smem);
  if (threadIdx.x == 0) stats[kLossPending] += s / double(B);
}
__global__ void close_update_loss_kernel(double* stats, int micro_batches) {
  // stats (kNumStepStats) fp64
  ::vit::close_update_loss(stats, micro_batches);
}
}  // namespace

void loss_accumulate(double* stats, const float* losses, Index B) {
  loss_accumulate_kernel<<<1, 256, 0, stream()>>>(stats, losses, B);
  VIT_CUDA_LAUNCHED();
}
void close_update_loss(double* stats, int micro_batches) {
  close_update_loss_kernel<<<1, 1, 0, stream()>>>(stats, micro_batches);
  VIT_CUDA_LAUNCHED();
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return "unknown GPU";
  }
  return prop.name;
}

DeviceProps device_props() {
  DeviceProps d;
  int dev = 0, driver = 0;
  cudaDeviceProp prop{};
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  VIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  VIT_CUDA_CHECK(cudaDriverGetVersion(&driver));
  d.name = prop.name;
  d.major = prop.major;
  d.minor = prop.minor;
  d.sms = prop.multiProcessorCount;
  d.smem_per_block = int(prop.sharedMemPerBlockOptin);
  d.driver = std::to_string(driver);
  d.cublaslt = std::to_string(cublasLtGetVersion());
  return d;
}

StreamMarks::~StreamMarks() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);  // best effort in a destructor
}

void StreamMarks::record() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    VIT_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  VIT_CUDA_CHECK(cudaEventRecord(events_[used_], stream()));
  ++used_;
}

std::vector<double> StreamMarks::seconds() const {
  std::vector<double> s(used_, 0.0);
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0.0f;
    VIT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[i]));
    s[i] = 1e-3 * double(ms);
  }
  return s;
}

}  // namespace vit::cuda
