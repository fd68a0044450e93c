// Backend runtime: errors, device query, the op stream, scratch memory, type conversion.
#include <algorithm>
#include <array>
#include <mutex>

#include "ops/cuda/common.cuh"

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

void* scratch(size_t bytes, int slot) {
  struct Buf {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  static std::array<Buf, 8> bufs;  // freed by the driver at process exit
  static std::mutex mu;
  VIT_CHECK(slot >= 0 && slot < int(bufs.size()), "cuda::scratch: bad slot");
  std::lock_guard<std::mutex> lock(mu);
  Buf& b = bufs[slot];
  if (bytes > b.bytes) {
    // cudaFree waits for the device, so kernels still reading the old buffer finish first.
    if (b.ptr) VIT_CUDA_CHECK(cudaFree(b.ptr));
    b.ptr = nullptr;
    const size_t grown = std::max(bytes, b.bytes + b.bytes / 4);  // amortise slow growth
    VIT_CUDA_CHECK(cudaMalloc(&b.ptr, grown));
    b.bytes = grown;
  }
  return b.ptr;
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
